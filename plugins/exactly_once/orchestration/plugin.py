"""The Airflow plugin of the exactly-once library: the pipelines view and the metrics endpoint,
a FastAPI app in the api-server (`exactly_once.operate.overview_app`), and its page in the UI's
Browse menu. Registered through the `airflow.plugins` entry point of the installed package, so
a deployment adds no file to its plugins folder. Airflow imports it in every process; the app
is built in the api-server only, as Airflow's edge3 provider does, so that workers neither
import the web stack nor read connections as a server.
"""

from __future__ import annotations

import sys

from airflow.plugins_manager import AirflowPlugin

URL_PREFIX = "/exactly-once"
RUNNING_ON_APISERVER = len(sys.argv) > 1 and sys.argv[1] == "api-server"


def _apps() -> list[dict]:
    if not RUNNING_ON_APISERVER:
        return []
    from exactly_once import connections
    from exactly_once.operate.overview_app import app

    connections.read_from_metadata_database()  # the api-server is a server: Admin → Connections count
    return [{"app": app, "url_prefix": URL_PREFIX, "name": "Exactly-once pipelines"}]


class ExactlyOncePlugin(AirflowPlugin):
    name = "exactly_once"
    fastapi_apps = _apps()
    external_views = [{"name": "Exactly-once pipelines", "href": f"{URL_PREFIX}/", "destination": "nav",
                       "category": "browse", "url_route": "exactly-once-pipelines"}]
