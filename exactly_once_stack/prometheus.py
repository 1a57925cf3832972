"""The local stack's Prometheus (Debian's `prometheus` package, /usr/bin/prometheus), started
by `./dev up --monitoring`: it scrapes the pipelines' metrics from the Airflow api-server's
plugin endpoint (/exactly-once/metrics, with the token of the connection exactly_once_metrics
in a private file) and evaluates the alert rules of deploy/prometheus/alerts.yml.

Its config, data, log and PID file live in .local/prometheus; it listens on 127.0.0.1 only.
"""

from __future__ import annotations

import json
import shutil
import urllib.parse
import urllib.request

from exactly_once_stack import process
from exactly_once_stack.private import write_private
from exactly_once_stack.settings import LOCAL, LOOPBACK, ROOT, passwords, ports

HOME = LOCAL / "prometheus"
CONFIG = HOME / "prometheus.yml"
TOKEN = HOME / "scraper.token"
LOG = HOME / "prometheus.log"
PID_FILE = HOME / "prometheus.pid"
RULES = ROOT / "deploy" / "prometheus" / "alerts.yml"
MARKER = "prometheus"
METRICS_PATH = "/exactly-once/metrics"


def url() -> str:
    return f"http://{LOOPBACK}:{ports()['prometheus']}"


def _config(scrape_interval: str, pipelines: list[str] | None) -> str:
    """JSON is YAML: the scrape of the api-server's endpoint (of `pipelines` only, if given),
    and the alert rules."""
    return json.dumps({
        "global": {"scrape_interval": scrape_interval, "evaluation_interval": scrape_interval},
        "rule_files": [str(RULES)],
        "scrape_configs": [{
            "job_name": "exactly_once", "metrics_path": METRICS_PATH, "scheme": "http",
            "authorization": {"type": "Bearer", "credentials_file": str(TOKEN)},
            "static_configs": [{"targets": [f"{LOOPBACK}:{ports()['airflow_api']}"]}],
            **({"params": {"pipeline": pipelines}} if pipelines else {}),
        }],
    }, indent=2)


def pid() -> int | None:
    found = process.read_pid(PID_FILE)
    return found if found and process.alive(found, MARKER) else None


def ready() -> bool:
    try:
        with urllib.request.urlopen(f"{url()}/-/ready", timeout=5) as response:
            return response.status == 200
    except OSError:
        return False


def start(scrape_interval: str = "15s", pipelines: list[str] | None = None, fresh: bool = False) -> bool:
    """Writes its config and the scrapers' token, starts Prometheus and waits until it is
    ready; `fresh`: without the samples of earlier starts. False, and nothing done, if it
    runs already."""
    if pid() is not None:
        return False
    binary = shutil.which("prometheus")
    if binary is None:
        raise RuntimeError("no prometheus on PATH: run exactly_once_stack/setup.sh (Debian's prometheus package)")
    if fresh:
        shutil.rmtree(HOME / "data", ignore_errors=True)
    HOME.mkdir(parents=True, exist_ok=True)
    write_private(TOKEN, passwords()["metrics_scraper"])
    CONFIG.write_text(_config(scrape_interval, pipelines))
    process.start_ready([binary, f"--config.file={CONFIG}", f"--storage.tsdb.path={HOME / 'data'}",
                         f"--web.listen-address={LOOPBACK}:{ports()['prometheus']}"],
                        LOG, PID_FILE, HOME, lambda: pid() is not None and ready(), 60, "prometheus", stop)
    return True


def stop() -> None:
    running = pid()
    if running is not None:
        process.stop(running, MARKER)


def _api(path: str) -> dict:
    with urllib.request.urlopen(f"{url()}/api/v1/{path}", timeout=30) as response:
        answer = json.load(response)
    if answer["status"] != "success":
        raise RuntimeError(f"prometheus refused {path!r}: {answer}")
    return answer["data"]


def query(promql: str) -> list[dict]:
    """The instant vector Prometheus's HTTP API gives for `promql`."""
    return _api(f"query?{urllib.parse.urlencode({'query': promql})}")["result"]


def scrape_health() -> list[str]:
    """Each target's URL, health and last error, as Prometheus says."""
    return [f"{t['scrapeUrl']}: {t['health']} {t['lastError']}".strip() for t in _api("targets")["activeTargets"]]
