"""The simulator core: the step loop, its state and the contract a policy fulfils."""
