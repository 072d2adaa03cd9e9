"""A Python client of the memsweep REST service (httpx).

    from service.client import MemsweepClient
    client = MemsweepClient()                                        # MEMSWEEP_API_URL and _TOKEN, as the CLI
    client = MemsweepClient("http://127.0.0.1:8000", token="…")      # or given: an argument wins
    study = client.submit("orhan2020-copy500", models=["chain"], seeds=[1, 2], base={"steps": 3000})
    client.wait(study["id"])                                         # a progress bar until it finishes
    client.best(study["id"], k=3)
    client.success_table(study["id"])                                # a pandas DataFrame per model
    client.plan("orhan2020-copy500", models=["chain"])               # trials, bundles, estimate: nothing runs
    client.submit("mine.yaml", seeds=[1, 2])                         # a spec file, read as the CLI reads it
    client.compare([study["id"], other["id"]], by="model")           # rates side by side, differences

Answers are the server's JSON (dicts); a refused request raises `MemsweepAPIError` with the server's
explanation, and an answer that is not JSON (another server at the URL) `NotMemsweepError`.
"""

from __future__ import annotations

import enum
import sys
import time
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import httpx

from service.core.states import FINAL

if TYPE_CHECKING:
    import pandas as pd

    from service.core.criterion_query import CriterionQuery, SuccessQuery
    from service.core.spec import StudySpec

FINAL_STATES = FINAL  # (a study's end states: `service.core.states`, which imports nothing but enum)
#: how a server that is away for a moment answers, if at all: a proxy in front of one restarting (502,
#: 504), or one not ready yet (503); `wait` polls on through these, and through no answer at all
AWAY = (502, 503, 504)
#: seconds `wait` keeps polling a server that is away (a restart: it resumes the study) before it gives up
SERVER_PATIENCE = 300.0


class MemsweepAPIError(RuntimeError):
    """The server refused a request; `status` is the HTTP status, `detail` its explanation."""

    def __init__(self, status: int, detail: Any, method: str, path: str) -> None:
        self.status, self.detail = status, detail
        text = detail.get("message", detail) if isinstance(detail, dict) else detail
        super().__init__(f"{method} {path} → {status}: {text}")


class NotMemsweepError(MemsweepAPIError):
    """The URL answered, but not as a memsweep server (not JSON: another server there, e.g. MLflow's)."""


class TrialPages:
    """A study's trials over `trials_page`, every page in turn: the client's (over REST) and the
    CLI's local answers (`service.cli.local`) page the same way."""

    #: one page of a study's trials: (study_id, offset, limit, status, success, sort, order, history,
    #: model=, params=) → {"total", "offset", "limit", "criterion", "items"}
    trials_page: Callable[..., dict[str, Any]]

    def trials(
        self,
        study_id: str,
        status: str | list[str] | None = None,
        success: bool | None = None,
        sort: str = "id",
        order: str = "asc",
        limit: int | None = None,
        history: bool = False,
        model: str | list[str] | None = None,
        params: Mapping[str, Any] | None = None,
    ) -> list[dict[str, Any]]:
        """The study's trials (every page, or the first `limit`), filtered and sorted on the server:
        by status, success, model, and the point's values (`params={"lr": 0.001}`)."""
        return list(
            self.iter_trials(
                study_id, status, success, sort, order, limit, history, model=model, params=params
            )
        )

    def iter_trials(
        self,
        study_id: str,
        status: str | list[str] | None = None,
        success: bool | None = None,
        sort: str = "id",
        order: str = "asc",
        limit: int | None = None,
        history: bool = False,
        page: int = 500,
        model: str | list[str] | None = None,
        params: Mapping[str, Any] | None = None,
    ) -> Iterator[dict[str, Any]]:
        offset, seen = 0, 0
        while True:
            size = page if limit is None else min(page, limit - seen)
            if size <= 0:
                return
            body = self.trials_page(
                study_id, offset, size, status, success, sort, order, history, model=model, params=params
            )
            yield from body["items"]
            seen += len(body["items"])
            offset += len(body["items"])
            if not body["items"] or offset >= body["total"]:
                return


def param_filters(params: Mapping[str, Any]) -> list[str]:
    """`{"lr": 0.001}` as the trials route's `param` filters: `["lr=0.001"]` (values as tables print them)."""
    return [f"{k}={v:g}" if isinstance(v, float) else f"{k}={v}" for k, v in params.items()]


def query_values(query: CriterionQuery | None, **given: Any) -> dict[str, Any]:
    """A success query's values by name, none left empty: `query`'s, or the keywords `given` where
    there is none (both: refused, as one would silently win). A loose keyword's value goes to the
    server unchecked: the server judges it by its own version's bounds, and its 422 says what is wrong."""
    if query is None:
        return {k: v for k, v in given.items() if v is not None}
    if named := [k for k, v in given.items() if v is not None]:
        raise TypeError(f"give query= or {', '.join(named)}, not both")
    return query.model_dump(exclude_none=True)


class FromEnvironment(enum.Enum):
    """`MemsweepClient`'s default token: MEMSWEEP_API_TOKEN's value, as the CLI reads it."""

    TOKEN = "MEMSWEEP_API_TOKEN"

    def __repr__(self) -> str:  # the signature, as help() shows it: token=MEMSWEEP_API_TOKEN
        return self.value


class MemsweepClient(TrialPages):
    def __init__(
        self,
        url: str | None = None,
        token: str | FromEnvironment | None = FromEnvironment.TOKEN,
        timeout: float = 30.0,
        http: httpx.Client | None = None,
    ) -> None:
        """The client of the server at `url` (default: MEMSWEEP_API_URL), sending `token` (default:
        MEMSWEEP_API_TOKEN's value, none when it is unset; `token=None`: none, whatever the environment
        holds). The environment is read as the CLI reads it (`service.core.settings.Settings`: the
        variables, else a `.env` file in the working directory), when the client is made; an argument
        given wins. `http`: an httpx.Client to send through (e.g. FastAPI's TestClient); default a new
        one for `url`."""
        where = ""  # where the URL came from, when an error names it
        if url is None or token is FromEnvironment.TOKEN:
            from service.core.settings import Settings  # pydantic-settings: only when one is left out

            settings = Settings()
            if url is None:
                if not settings.api_url:
                    raise ValueError(
                        "url: none given and MEMSWEEP_API_URL is not set; give the server's URL, "
                        f"MemsweepClient(url='http://127.0.0.1:{settings.port}'), or set MEMSWEEP_API_URL"
                    )
                url, where = settings.api_url, " (MEMSWEEP_API_URL)"
            if token is FromEnvironment.TOKEN:
                token = settings.api_token.get_secret_value() if settings.api_token else None
        scheme = httpx.URL(url).scheme if "://" in url else ""
        if scheme not in ("http", "https"):  # httpx said "missing an 'http://' protocol" on every call
            bare = url.split("://", 1)[-1]
            raise ValueError(
                f"url {url!r}{where} lacks its scheme (http or https): write it as http://{bare} (or "
                f"https://{bare})"
            )
        self.url = url.rstrip("/")
        self._headers = {"Authorization": f"Bearer {token}"} if token else {}
        self._http = http if http is not None else httpx.Client(base_url=self.url, timeout=timeout)

    def __enter__(self) -> MemsweepClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._http.close()

    def _call(self, method: str, path: str, **kw: Any) -> Any:
        headers = {**self._headers, **kw.pop("headers", {})}
        response = self._http.request(method, path, headers=headers, **kw)
        body = self._json(response, method, path)
        if response.status_code >= 400:
            raise self._refusal(response.status_code, body, method, path)
        return body

    @staticmethod
    def _refusal(status: int, body: Any, method: str, path: str) -> MemsweepAPIError:
        """A refusal's error: its `message` (every memsweep error answer has one), else its `detail`."""
        plain = isinstance(body, dict) and "message" not in body
        return MemsweepAPIError(status, body.get("detail", body) if plain else body, method, path)

    def _json(self, response: httpx.Response, method: str, path: str) -> Any:
        """The answer's JSON; an answer that is none (an HTML page: MLflow's 404 at a wrong port) raises
        `NotMemsweepError` naming its status and content type, not the page."""
        try:
            return response.json()
        except ValueError:
            kind = response.headers.get("content-type", "no content type").split(";")[0]
            said = f"({response.status_code}, {kind}, {len(response.content):,} bytes, not JSON)"
            detail = (
                f"{self.url} answered {said}, not as memsweep does: a proxy in front of the server refused "
                "the request, or another server is at this URL (a memsweep server answers GET /health with JSON)"
                if response.status_code >= 400
                else f"{self.url} does not answer as a memsweep server {said}; check the URL: a memsweep "
                "server answers GET /health with JSON"
            )
            raise NotMemsweepError(response.status_code, detail, method, path) from None

    @staticmethod
    def _study(study_id: str, tail: str = "") -> str:
        """The path of a study's route; an empty id is refused (GET /studies/ is the list, not a study)."""
        if not study_id.strip():
            raise ValueError(
                f"study_id {study_id!r} is empty: give a study's id (`client.studies()` lists them)"
            )
        return f"/studies/{study_id}{tail}"

    # ----- studies -----------------------------------------------------------------------------------
    def submit(
        self,
        spec: str | Path | Mapping[str, Any] | Any,
        idempotency_key: str | None = None,
        **overrides: Any,
    ) -> dict[str, Any]:
        """Create a study: a preset name, a spec file (`Path("mine.yaml")` or `"mine.yaml"`), a spec dict
        or a `StudySpec`, with field overrides.

        A key is generated when none is given, so a retried submit never makes a second study."""
        data = spec_data(spec, overrides)
        key = idempotency_key or uuid.uuid4().hex
        result: dict[str, Any] = {}
        for attempt in range(3):
            try:
                result = self._call("POST", "/studies", json=data, headers={"Idempotency-Key": key})
                break
            except (httpx.TransportError, MemsweepAPIError) as exc:  # retry what the key makes safe
                conflict = isinstance(exc, MemsweepAPIError) and exc.status == 409
                if attempt == 2 or not (isinstance(exc, httpx.TransportError) or conflict):
                    raise
                time.sleep(0.5 * (attempt + 1))
        return result

    def plan(
        self,
        spec: str | Path | Mapping[str, Any] | Any,
        recalibrate: bool = False,
        timeout: float = 600.0,
        **overrides: Any,
    ) -> dict[str, Any]:
        """What a study would run and cost, nothing stored (`POST /studies?dry_run=true`): trials per
        model, units and bundle sizes, the budget in steps, and the estimate from calibrations (which
        may take a few seconds the first time a shape is seen, hence the longer `timeout`)."""
        params = {"dry_run": True, "recalibrate": recalibrate}
        result: dict[str, Any] = self._call(
            "POST", "/studies", json=spec_data(spec, overrides), params=params, timeout=timeout
        )
        return result

    def get(self, study_id: str) -> dict[str, Any]:
        """State, counts, ETA and MLflow links."""
        result: dict[str, Any] = self._call("GET", self._study(study_id))
        return result

    def studies(self, state: str | None = None, *, offset: int = 0, limit: int = 50) -> list[dict[str, Any]]:
        """The studies, newest first, each as a summary (id, name, state, counts, times); `get` has a
        study's full record (spec, plan, ETA, MLflow links)."""
        items: list[dict[str, Any]] = self.studies_page(state, offset=offset, limit=limit)["items"]
        return items

    def studies_page(self, state: str | None = None, *, offset: int = 0, limit: int = 50) -> dict[str, Any]:
        """One page of `GET /studies`: `total` (studies in `state`, or all), `offset`, `limit`, `items`."""
        params: dict[str, Any] = {"offset": offset, "limit": limit, **({"state": state} if state else {})}
        page: dict[str, Any] = self._call("GET", "/studies", params=params)
        return page

    def wait(
        self,
        study_id: str,
        poll: float = 2.0,
        timeout: float | None = None,
        progress: bool = True,
        patience: float = SERVER_PATIENCE,
        console: Any = None,
    ) -> dict[str, Any]:
        """Poll until the study is done, failed or cancelled (a rich progress bar unless progress=False,
        on `console`, a rich Console: default stdout at its terminal's width).

        A server that stops answering (no connection, or 502, 503, 504) once it has answered is polled on
        for `patience` seconds, said on stderr: a restarted server resumes the study, and the wait goes
        on with it. One that never answered is a wrong URL: its error is raised at once."""
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

        deadline = None if timeout is None else time.monotonic() + timeout
        away_since: float | None = None  # when the server stopped answering, while it does not
        answered = False  # a URL that never answered is a wrong one, said at once, not waited for
        with Progress(
            TextColumn(f"[bold]study {study_id}"), BarColumn(), MofNCompleteColumn(),
            TextColumn("{task.fields[info]}", markup=False), TimeElapsedColumn(), disable=not progress,
            console=console,
        ) as bar:  # fmt: skip
            task = bar.add_task("study", total=None, info="")
            while True:
                try:
                    study = self.get(study_id)
                except (httpx.TransportError, MemsweepAPIError) as exc:
                    if not answered or (isinstance(exc, MemsweepAPIError) and exc.status not in AWAY):
                        raise
                    now = time.monotonic()
                    if away_since is None:
                        away_since = now
                        print(
                            f"study {study_id}: the server at {self.url} does not answer ({exc}); waiting "
                            f"for it up to {patience:g} s (a restarted server resumes the study)",
                            file=sys.stderr,
                        )
                    elif now - away_since > patience:
                        print(
                            f"study {study_id}: the server at {self.url} has not answered for {patience:g} s; "
                            f"giving up (the study goes on if the server does: `memsweep status {study_id} "
                            f"--url {self.url}` asks)",
                            file=sys.stderr,
                        )
                        raise
                    if deadline is not None and now > deadline:
                        raise TimeoutError(
                            f"study {study_id}: no answer from the server at {self.url} after {timeout:g} s"
                        ) from exc
                    time.sleep(poll)
                    continue
                answered = True
                if away_since is not None:
                    away_since = None
                    print(f"study {study_id}: the server at {self.url} answers again", file=sys.stderr)
                c = study["counts"]
                eta = f"ETA {study['eta_seconds']:,.0f}s" if study.get("eta_seconds") is not None else "ETA –"
                info = f"{study['state']} · running {c['running']} · failed {c['failed']} · successes {c['succeeded']} · {eta}"
                bar.update(task, total=study["expected_trials"] or None, completed=c["finished"], info=info)
                if study["state"] in FINAL_STATES and not study["active"]:
                    return study
                if deadline is not None and time.monotonic() > deadline:
                    raise TimeoutError(f"study {study_id} is still {study['state']} after {timeout:g} s")
                time.sleep(poll)

    def cancel(self, study_id: str) -> dict[str, Any]:
        """Stop a study; answered at once, as it stands: `running` and `active` while its running units
        stop (seconds), then `cancelled` (`wait(study_id)` follows it there)."""
        result: dict[str, Any] = self._call("POST", self._study(study_id, "/cancel"))
        return result

    def resume(self, study_id: str) -> dict[str, Any]:
        result: dict[str, Any] = self._call("POST", self._study(study_id, "/resume"))
        return result

    def sync(self, study_id: str) -> dict[str, Any]:
        """Rebuild the study's MLflow runs from the ledger (after MLflow was down or lost its store)."""
        result: dict[str, Any] = self._call("POST", self._study(study_id, "/sync"))
        return result

    def extend(self, study_id: str, **changes: Any) -> dict[str, Any]:
        """Grow a study: `seeds`, a dimension of `dims`, `models` are each given whole, the study's values
        with the new ones (`extend(id, seeds=[1, 2, 3])` adds seed 3 to a study of [1, 2]; one leaving
        out values the study holds is refused); `max_trials` a sampled study's new budget. Returns
        {"added", "study"}."""
        result: dict[str, Any] = self._call("POST", self._study(study_id, "/extend"), json=changes)
        return result

    # ----- answers -----------------------------------------------------------------------------------
    def best(self, study_id: str, k: int = 5, model: str | None = None) -> list[dict[str, Any]]:
        params: dict[str, Any] = {"k": k, **({"model": model} if model else {})}
        result: list[dict[str, Any]] = self._call("GET", self._study(study_id, "/best"), params=params)
        return result

    def success(
        self,
        study_id: str,
        fraction: float | None = None,
        threshold: float | None = None,
        baseline: str | None = None,
        at_step: int | None = None,
        reference: str | None = None,
        *,
        query: SuccessQuery | None = None,
    ) -> dict[str, Any]:
        """The raw success table {"criterion", "at_step", "total", "by_model", "by_value", "reference",
        "differences", "notes"}: under the study's criterion, or the fraction / threshold / reference baseline
        given, at the end of each run or at a budget of `at_step` steps (a recount: nothing trains);
        with a `reference` model, each model's rate minus its own, with Newcombe's 95 % interval.
        `query`: those four as one `service.core.criterion_query.SuccessQuery`, instead."""
        params = query_values(
            query, fraction=fraction, threshold=threshold, baseline=baseline, at_step=at_step
        )
        if reference is not None:
            params["reference"] = reference
        result: dict[str, Any] = self._call("GET", self._study(study_id, "/success"), params=params)
        return result

    def success_vs_budget(
        self,
        study_id: str,
        fraction: float | None = None,
        threshold: float | None = None,
        baseline: str | None = None,
        *,
        query: CriterionQuery | None = None,
    ) -> dict[str, Any]:
        """Successes per model against training steps: {"criterion", "steps", "by_model": {model: [cells]}},
        under the study's criterion or the fraction / threshold / reference baseline given (as `success`;
        `query`: those three as one `CriterionQuery`, instead)."""
        params = query_values(query, fraction=fraction, threshold=threshold, baseline=baseline)
        result: dict[str, Any] = self._call("GET", self._study(study_id, "/success/budget"), params=params)
        return result

    def success_table(
        self, study_id: str, by: Literal["model", "value"] = "model", **criterion: Any
    ) -> pd.DataFrame:
        """Successes with 95 % Wilson intervals: one row per model, or per (model, field, value);
        `criterion`: fraction / threshold / baseline / at_step (or query) / reference as for `success`
        (by model, `reference=MODEL` adds each model's rate minus its, with Newcombe's interval, and
        marks that model's own row `is_reference`, its difference empty). The frame's `attrs` name the
        criterion, the budget, the reference and the table's notes."""
        import pandas as pd

        from service.reports.tables import CELL_COLUMNS

        if by not in ("model", "value"):  # "lr" gave every field's rows, as if it chose one
            raise ValueError(
                f"by={by!r}: give 'model' (a row per model) or 'value' (a row per model, field and value; "
                "select a field's rows with frame.xs(FIELD, level='field'))"
            )
        table = self.success(study_id, **criterion)
        rows: list[dict[str, Any]] = []
        if by == "model":
            differences = table.get("differences") or {}
            extra = DIFFERENCE_COLUMNS if differences else []
            for model, cell in table["by_model"].items():
                row = {"model": model, **_flat(cell)}
                if differences:  # `reference=MODEL`: each model's rate minus its, Newcombe's interval
                    d = differences.get(model) or {}
                    low, high = d.get("ci95") or (None, None)
                    row.update(
                        difference=d.get("difference"), difference_ci95_low=low, difference_ci95_high=high,
                        is_reference=model == table["reference"],
                    )  # fmt: skip
                rows.append(row)
            frame = pd.DataFrame(rows, columns=["model", *CELL_COLUMNS, *extra]).set_index("model")
        else:
            for model, fields in table["by_value"].items():
                for field, values in fields.items():
                    for value, cell in values.items():
                        rows.append({"model": model, "field": field, "value": value, **_flat(cell)})
            frame = pd.DataFrame(rows, columns=["model", "field", "value", *CELL_COLUMNS])
            frame = frame.set_index(["model", "field", "value"])
        frame.attrs.update(
            criterion=table["criterion"]["name"], at_step=table["at_step"], reference=table.get("reference"),
            notes=table.get("notes") or [],
        )  # fmt: skip
        return frame

    def comparison(
        self,
        studies: Sequence[str],
        by: str | Sequence[str] = "model",
        fraction: float | None = None,
        threshold: float | None = None,
        baseline: str | None = None,
        at_step: int | None = None,
        log: bool = False,
        *,
        query: SuccessQuery | None = None,
    ) -> dict[str, Any]:
        """The raw comparison of `GET /compare` (`by`, `reference`, `studies`, `rows`, `mlflow`); `log`:
        also an MLflow run with the table and its figure; `query`: the criterion and budget as one
        `SuccessQuery`, instead of fraction / threshold / baseline / at_step."""
        params = {
            "studies": ",".join(studies),
            "by": by if isinstance(by, str) else ",".join(by),
            **query_values(query, fraction=fraction, threshold=threshold, baseline=baseline, at_step=at_step),
            **({"log": True} if log else {}),
        }
        result: dict[str, Any] = self._call("GET", "/compare", params=params, timeout=120.0)
        return result

    def compare(
        self, studies: Sequence[str], by: str | Sequence[str] = "model", **options: Any
    ) -> pd.DataFrame:
        """Success counts of the studies side by side: one row per (scope, group…, study), with 95 % Wilson
        intervals and each study's difference from the first (95 % Newcombe interval, `shared` runs), and
        `pooled` rows counting every distinct run (config hash) of all the studies once;
        `options`: fraction / threshold / baseline / at_step (or query) / log as for `comparison`. The frame's
        `attrs` hold each study's criterion, the reference and the MLflow run."""
        import pandas as pd

        from service.reports.tables import csv_cells

        found = self.comparison(studies, by, **options)
        rows = [{**csv_cells(r), "study_id": r["study_id"] or "pooled"} for r in found["rows"]]
        index = ["scope", *(f"group.{f}" for f in found["by"]), "study_id"]
        frame = (
            pd.DataFrame(rows)
            .rename(columns=lambda c: c.removeprefix("group."))
            .set_index([i.removeprefix("group.") for i in index])
        )
        frame.attrs.update(
            criteria={s["study_id"]: s["criterion"]["name"] for s in found["studies"]},
            reference=found["reference"],
            at_step=found["at_step"],
            mlflow=found.get("mlflow"),
        )
        return frame

    def table_csv(self, path: str, **params: Any) -> str:
        """A table route's CSV text (`/studies/{id}/trials`, `/studies/{id}/success`, `/compare`), with
        its `# criterion` and `# trainer_version` lines; `service.reports.tables.read_csv` reads it."""
        headers = {**self._headers, "Accept": "text/csv"}
        response = self._http.get(
            path, params={k: v for k, v in params.items() if v is not None}, headers=headers
        )
        if response.status_code >= 400:
            raise self._refusal(response.status_code, self._json(response, "GET", path), "GET", path)
        return response.text

    def trials_page(
        self,
        study_id: str,
        offset: int = 0,
        limit: int = 500,
        status: str | list[str] | None = None,
        success: bool | None = None,
        sort: str = "id",
        order: str = "asc",
        history: bool = False,
        model: str | list[str] | None = None,
        params: Mapping[str, Any] | None = None,
    ) -> dict[str, Any]:
        """One page of trials as the server answers it: {"total", "offset", "limit", "criterion", "items"}."""
        query: dict[str, Any] = {
            "sort": sort,
            "order": order,
            "history": history,
            "offset": offset,
            "limit": limit,
        }
        if status is not None:
            query["status"] = [status] if isinstance(status, str) else list(status)
        if success is not None:
            query["success"] = success
        if model is not None:
            query["model"] = [model] if isinstance(model, str) else list(model)
        if params:
            query["param"] = param_filters(params)
        result: dict[str, Any] = self._call("GET", self._study(study_id, "/trials"), params=query)
        return result

    # ----- the rest ----------------------------------------------------------------------------------
    def plugins(self, timeout: float = 600.0) -> dict[str, Any]:
        """The server's plugin cells and tasks, and each Ray node's (`GET /plugins`; the first answer after
        a plugin is installed checks its contract, as `submit` does at the door: hence the longer
        `timeout`)."""
        result: dict[str, Any] = self._call("GET", "/plugins", timeout=timeout)
        return result

    def presets(self) -> list[dict[str, Any]]:
        result: list[dict[str, Any]] = self._call("GET", "/presets")
        return result

    def preset(self, name: str) -> dict[str, Any]:
        """One preset's grid (`GET /presets/{name}`); an unknown name raises `MemsweepAPIError` (404),
        naming the nearest preset. An empty name is refused here (GET /presets/ is the list)."""
        if not name.strip():
            raise ValueError(f"name {name!r} is empty: give a preset's name (`client.presets()` lists them)")
        result: dict[str, Any] = self._call("GET", f"/presets/{name}")
        return result

    def health(self) -> dict[str, Any]:
        result: dict[str, Any] = self._call("GET", "/health")
        return result

    def ready(self) -> dict[str, Any]:
        """{"ready", "checks"}; a server that is not ready answers 503, returned here, not raised."""
        response = self._http.get("/ready", headers=self._headers)
        result: dict[str, Any] = self._json(response, "GET", "/ready")
        if response.status_code not in (200, 503):
            raise self._refusal(response.status_code, result, "GET", "/ready")
        return result


def spec_data(spec: str | Path | Mapping[str, Any] | Any, overrides: Mapping[str, Any]) -> dict[str, Any]:
    """A preset name, a spec file (a `Path`, or a name ending .yaml, .yml or .json: read as the CLI reads
    it), a spec dict or a `StudySpec`, with field overrides, as a request's body."""
    data: dict[str, Any]
    if isinstance(spec, (str, Path)):
        from service.core.spec import names_spec_file  # pydantic and YAML: only for a name or a path

        if names_spec_file(spec):
            data = read_spec_file(spec).model_dump(mode="json", exclude_unset=True)
        else:
            data = {"preset": str(spec)}
    elif isinstance(spec, Mapping):
        data = dict(spec)
    else:  # a StudySpec
        data = spec.model_dump(mode="json", exclude_unset=True)
    data.update(overrides)
    return data


def read_spec_file(path: str | Path) -> StudySpec:
    """The `StudySpec` in a YAML or JSON file (`service.core.spec.load_spec`, as the CLI reads it); one
    that cannot be read, or whose fields are invalid, is refused naming the file and the fields."""
    from pydantic import ValidationError

    from service.core.errors import invalid_fields
    from service.core.spec import StudySpec, load_spec

    try:
        return load_spec(path)
    except ValidationError as exc:
        _, lines = invalid_fields(exc.errors(include_url=False), StudySpec)
        raise ValueError(f"{path}: {'; '.join(lines)}") from None


#: a success table's columns against a reference model (`success_table(..., reference=MODEL)`): the
#: reference's own row is `is_reference`, its difference empty (NaN), not a measured 0
DIFFERENCE_COLUMNS = ["difference", "difference_ci95_low", "difference_ci95_high", "is_reference"]


def _flat(cell: Mapping[str, Any]) -> dict[str, Any]:
    """A success cell as the frame's columns (`tables.CELL_COLUMNS`): its interval as low and high, as
    the JSON gives it (a CSV blanks the interval of a rate with no finished run)."""
    from service.reports.tables import CELL_FIELDS, INTERVALS

    out: dict[str, Any] = {}
    for field in CELL_FIELDS:
        if field in INTERVALS:
            out[f"{field}_low"], out[f"{field}_high"] = cell[field]
        else:
            out[field] = cell.get(field)
    return out
