"""Study files in, a validated :class:`StudySpec` out: the schema, ``${VAR}`` and ``--set``, and the
pre-flight checks that run before anything is created or submitted."""

from hpo.config.loading import load_study
from hpo.config.schema import (
    BACKENDS,
    COST_OBJECTIVES,
    EXECUTORS,
    METRICS,
    PRUNERS,
    RAY_ONLY_PRUNERS,
    SAMPLERS,
    LauncherSection,
    ParamSpec,
    PrunerSpec,
    Resources,
    SamplerSpec,
    StudySection,
    StudySpec,
    parse_duration_min,
)

__all__ = [
    "BACKENDS",
    "COST_OBJECTIVES",
    "EXECUTORS",
    "METRICS",
    "PRUNERS",
    "RAY_ONLY_PRUNERS",
    "SAMPLERS",
    "LauncherSection",
    "ParamSpec",
    "PrunerSpec",
    "Resources",
    "SamplerSpec",
    "StudySection",
    "StudySpec",
    "load_study",
    "parse_duration_min",
]
