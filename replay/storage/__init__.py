"""Files: the data directory and the pinned remote files it holds (:mod:`.data`), and outputs
written atomically and verified before reuse (:mod:`.outputs`)."""
