"""``hpo tunnel``: the ssh commands that bring the study's dashboards to a laptop."""

from __future__ import annotations

import argparse

from hpo.commands.common import Command, Options, add_study_arguments, open_study, print_lines


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_study_arguments(parser)
    parser.add_argument("--open", action="store_true", help="run the Ray dashboard's tunnel")


def run(options: Options) -> int:
    from hpo import study_record
    from hpo.observe import dashboard, tunnel

    spec, _, study = open_study(options)
    if options.open:
        return tunnel.open_tunnel(spec, study)
    with_ray = spec.study.on_ray or study_record.ray_job(study) is not None
    return print_lines(
        tunnel.tunnel_commands(spec, study, with_ray=with_ray, dashboard_port=dashboard.DEFAULT_PORT)
    )


COMMAND = Command(
    name="tunnel",
    help="print the ssh commands that reach the study's dashboards",
    add_arguments=add_arguments,
    run=run,
)
