"""Scheduling policies. Each is one small module plus one ``configs/policy/*.yaml``.

A policy implements :class:`replay.engine.policy.Policy`: ``decide(view) -> Batch`` and an
``overflow`` rule. Shared logic lives in :mod:`policies.common.lookahead`.
"""
