"""Study files in, a validated :class:`StudySpec` out: ``${VAR}`` and ``--set`` (loading), each
section's keys (study, search_space, resources and launcher, objective; the values they take),
and the whole file's schema. Pure input: the checks that need the machine are dispatch's."""

from hpo.config.loading import load_study
from hpo.config.resources import LauncherSection, Resources
from hpo.config.schema import StudySpec
from hpo.config.space import ParamSpec
from hpo.config.study_section import PrunerSpec, SamplerSpec, StudySection
from hpo.config.values import (
    BACKENDS,
    COST_OBJECTIVES,
    METRICS,
    PRUNERS,
    RAY_ONLY_PRUNERS,
    SAMPLERS,
    parse_duration_min,
)

__all__ = [
    "BACKENDS",
    "COST_OBJECTIVES",
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
