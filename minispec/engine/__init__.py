"""Continuous batching with speculative decoding and a paged KV cache: a small serving engine.

Read in this order: :mod:`~minispec.engine.request` (a request's life), :mod:`~minispec.engine.blocks`
(KV slots in blocks, lookahead slots), :mod:`~minispec.engine.paged` (attention through block tables),
:mod:`~minispec.engine.scheduler` (the token budget, preemption, gamma per step),
:mod:`~minispec.engine.drafting` (draft state that outlives a step), :mod:`~minispec.engine.runner`
(one step on the models, through the package's own speculative step), :mod:`~minispec.engine.engine`
(the loop and the clock).
"""

from minispec.engine.engine import Engine, EngineStats
from minispec.engine.request import Request, RequestOutput
from minispec.engine.scheduler import Scheduler, StepPlan

__all__ = ["Engine", "EngineStats", "Request", "RequestOutput", "Scheduler", "StepPlan"]
