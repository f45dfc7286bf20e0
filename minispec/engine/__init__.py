"""Continuous batching with speculative decoding and a paged KV cache: a small serving engine.

Read in this order: :mod:`~minispec.engine.request` (a request's life), :mod:`~minispec.engine.blocks`
(KV slots in blocks, lookahead slots), :mod:`~minispec.engine.scheduler` (the token budget, preemption, gamma
per step), :mod:`~minispec.engine.paged` (the KV pool and a draft's view of it),
:mod:`~minispec.engine.attention` (the target's step in one flattened pass, attention through the block
tables), :mod:`~minispec.engine.batch` (what the device keeps per running request),
:mod:`~minispec.engine.drafting` (draft state that outlives a step), :mod:`~minispec.engine.runner` (one
step on the models, accepted by the package's own rule), :mod:`~minispec.engine.engine` (the loop and the
clock).
"""

from minispec.engine.engine import Engine, EngineStats
from minispec.engine.request import Request, RequestOutput
from minispec.engine.scheduler import Scheduler, StepPlan

__all__ = ["Engine", "EngineStats", "Request", "RequestOutput", "Scheduler", "StepPlan"]
