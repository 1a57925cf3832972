"""python -m exactly_once_stack {up [--monitoring] [--cdc]|down|status|versions|running}
(running: exit status 0 when PostgreSQL and Kafka run; --monitoring: Prometheus too; --cdc:
Kafka Connect with Debezium capturing the `source` database)"""

from __future__ import annotations

import argparse

from exactly_once_stack import lifecycle


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m exactly_once_stack", description=__doc__)
    parser.add_argument("command", choices=["up", "down", "status", "versions", "running"])
    parser.add_argument("--monitoring", action="store_true",
                        help="up: start Prometheus too, scraping the pipelines' metrics from the api-server")
    parser.add_argument("--cdc", action="store_true",
                        help="up: start Kafka Connect with Debezium, capturing schema inventory of database source")
    arguments = parser.parse_args()
    command = arguments.command
    if command == "running":
        raise SystemExit(0 if lifecycle.running() else 1)
    if command == "up":
        started = lifecycle.up(monitoring=arguments.monitoring, cdc=arguments.cdc)
        print("started: " + (", ".join(started) or "nothing (all running)"))
        command = "status"
    if command == "down":
        lifecycle.down()
        command = "status"
    report = lifecycle.status() if command == "status" else lifecycle.versions()
    width = max(map(len, report))
    for name, value in report.items():
        print(f"{name:<{width}}  {value}")


if __name__ == "__main__":
    main()
