"""Serving under load, modelled: a discrete-event simulator of continuous batching with speculation.

Published incidents are replayed on it.

:mod:`~minispec.serving.traffic` (who arrives), :mod:`~minispec.serving.steps` (what a step costs),
:mod:`~minispec.serving.simulator` (the scheduler and the event loop), :mod:`~minispec.serving.incidents`
(published cases where speculation hurt, replayed). Every public name of the first three is importable from here.
"""

from minispec.serving.simulator import (  # noqa: F401 re-exported
    Run,
    Scheduler,
    Step,
    simulate,
    sweep,
)
from minispec.serving.steps import (  # noqa: F401 re-exported
    NVLINK_BANDWIDTH,
    EngineSteps,
    MeasuredSteps,
    RooflineSteps,
    StepTimes,
)
from minispec.serving.traffic import (  # noqa: F401 re-exported
    MIX,
    Lengths,
    Request,
    Traffic,
    Workload,
    acceptance,
    conditional,
    expected_tokens,
    poisson_requests,
)
