"""The pipelines view's web app, which the plugin (exactly_once.orchestration.plugin) mounts in Airflow's
api-server under /exactly-once (and adds to the UI's Browse menu):

    GET /exactly-once/                   the page (HTML), shown in the UI
    GET /exactly-once/api/pipelines      the same figures as JSON
    GET /exactly-once/metrics            every pipeline's metrics, Prometheus's text format
                                         (exactly_once.operate.metrics), for a scraper

Read-only. Airflow does not authenticate a plugin's app, so every request goes through
Airflow's own `get_user` (the UI's session cookie or an `Authorization: Bearer` token from
`POST /auth/token`): none gives 401, an invalid one 403. A user sees the pipelines whose
DAG's runs the auth manager lets them read. Raw payload previews of dead letters (and their
exact reasons) are shown only when `[exactly_once] show_payloads` is on (default off;
AIRFLOW__EXACTLY_ONCE__SHOW_PAYLOADS) and only to a user the auth manager lets edit the DAG.
The metrics are for a scraper, which holds no Airflow login: it sends `Authorization: Bearer
TOKEN`, the password of the connection `exactly_once_metrics` (no header: 401, another token:
403; the connection undefined: 404, the endpoint is off). They carry no record value.
The ledger is read through the connection `pipeline_db_read` when it is defined, else
`pipeline_db`.
"""

from __future__ import annotations

import hmac
from collections.abc import Callable
from contextlib import closing
from datetime import datetime, timezone
from urllib.parse import urlparse

from airflow.api_fastapi.app import get_auth_manager
from airflow.api_fastapi.auth.managers.models.resource_details import DagAccessEntity, DagDetails
from airflow.api_fastapi.core_api.security import GetUserDep
from airflow.configuration import conf
from airflow.sdk.exceptions import AirflowNotFoundException
from fastapi import FastAPI, Header, HTTPException, Query
from fastapi.encoders import jsonable_encoder
from fastapi.responses import HTMLResponse, JSONResponse, PlainTextResponse

from exactly_once import connections
from exactly_once.errors import ConfigError
from exactly_once.operate.metrics import exposition, read_samples
from exactly_once.operate.overview import LedgerBehind, PipelineOverview, read_overviews, refuse_if_behind
from exactly_once.operate.overview_page import page
from exactly_once.operate.status import ledger_reader

History = Query(20, ge=1, le=200, description="checkpoints in the history and its charts")
DeadLetters = Query(10, ge=1, le=100, description="newest dead letters shown per pipeline")
Only = Query(None, description="only these pipelines (default: every one the user may see)")

# No unauthenticated OpenAPI pages: the app's only routes are the three below.
app = FastAPI(title="Exactly-once pipelines", docs_url=None, redoc_url=None, openapi_url=None)


@app.exception_handler(LedgerBehind)
def ledger_behind(request, behind: LedgerBehind) -> PlainTextResponse:
    return PlainTextResponse(str(behind), status_code=503)


def visible_overviews(user, history: int, dead_letters: int, only: list[str] | None = None) -> list[PipelineOverview]:
    try:
        kafka = connections.kafka_client()
    except (ConfigError, AirflowNotFoundException) as unusable:
        kafka = f"no usable Kafka connection: {unusable}"
    def visible(dag_id: str | None) -> bool:
        """The user may read the DAG's runs; a pipeline whose DAG is not known yet (none of its
        runs began since migration 0007) needs that right on every DAG."""
        return get_auth_manager().is_authorized_dag(method="GET", access_entity=DagAccessEntity.RUN, user=user,
                                                    details=None if dag_id is None else DagDetails(id=dag_id))

    return read_overviews(ledger_reader(), kafka, history, dead_letters, visible, payloads_rule(user), only)


def payloads_rule(user) -> Callable[[str | None], bool]:
    """Of which pipelines (by DAG) the user sees the dead letters' record values (the first
    bytes, a reason's exact text): none unless `[exactly_once] show_payloads` is on (default
    off; AIRFLOW__EXACTLY_ONCE__SHOW_PAYLOADS), then those whose DAG the auth manager lets the
    user edit (PUT on the DAG; every DAG, for a pipeline whose DAG is not known yet)."""
    if not conf.getboolean("exactly_once", "show_payloads", fallback=False):
        return lambda _dag_id: False
    return lambda dag_id: get_auth_manager().is_authorized_dag(
        method="PUT", user=user, details=None if dag_id is None else DagDetails(id=dag_id))


@app.get("/", response_class=HTMLResponse)
def pipelines_page(user: GetUserDep, history: int = History, dead_letters: int = DeadLetters) -> HTMLResponse:
    ui_root = urlparse(conf.get("api", "base_url", fallback="/")).path.rstrip("/")
    return HTMLResponse(page(visible_overviews(user, history, dead_letters), ui_root, history,
                             datetime.now(timezone.utc)))


@app.get("/api/pipelines")
def pipelines_data(user: GetUserDep, history: int = History, dead_letters: int = DeadLetters,
                   pipeline: list[str] | None = Only) -> JSONResponse:
    return JSONResponse(jsonable_encoder(visible_overviews(user, history, dead_letters, pipeline)))


@app.get("/metrics", response_class=PlainTextResponse)
def metrics(authorization: str | None = Header(None),
            pipeline: list[str] | None = Query(None, description="only these pipelines (default: all)")
            ) -> PlainTextResponse:
    expected = connections.scraper_token()
    if expected is None:
        raise HTTPException(404, f"the metrics endpoint is off: define the connection {connections.METRICS_SCRAPER!r} "
                                 "with the scrapers' token as its password")
    if authorization is None:
        raise HTTPException(401, "Not authenticated", headers={"WWW-Authenticate": "Bearer"})
    scheme, _, token = authorization.partition(" ")
    if scheme.lower() != "bearer" or not hmac.compare_digest(token.encode(), expected.encode()):
        raise HTTPException(403, "Invalid token")
    try:
        kafka = connections.kafka_client()
    except (ConfigError, AirflowNotFoundException):
        kafka = None
    with closing(ledger_reader()()) as conn:
        refuse_if_behind(conn)
        text = exposition(read_samples(conn, kafka, datetime.now(timezone.utc), pipeline))
    return PlainTextResponse(text, media_type="text/plain; version=0.0.4")
