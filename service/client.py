"""A Python client of the memsweep REST service (httpx).

    from service.client import MemsweepClient
    client = MemsweepClient("http://127.0.0.1:8000", token="…")      # token: MEMSWEEP_API_TOKEN's value
    study = client.submit("orhan2020-copy500", models=["chain"], seeds=[1, 2], base={"steps": 3000})
    client.wait(study["id"])                                         # a progress bar until it finishes
    client.best(study["id"], k=3)
    client.success_table(study["id"])                                # a pandas DataFrame per model

Answers are the server's JSON (dicts); a refused request raises `MemsweepAPIError` with the server's
explanation.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Any, Literal

import httpx

if TYPE_CHECKING:
    import pandas as pd

FINAL_STATES = ("done", "failed", "cancelled")


class MemsweepAPIError(RuntimeError):
    """The server refused a request; `status` is the HTTP status, `detail` its explanation."""

    def __init__(self, status: int, detail: Any, method: str, path: str) -> None:
        self.status, self.detail = status, detail
        text = detail.get("message", detail) if isinstance(detail, dict) else detail
        super().__init__(f"{method} {path} → {status}: {text}")


class MemsweepClient:
    def __init__(
        self, url: str, token: str | None = None, timeout: float = 30.0, http: httpx.Client | None = None
    ) -> None:
        """`http`: an httpx.Client to send through (e.g. FastAPI's TestClient); default a new one for `url`."""
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
        if response.status_code >= 400:
            try:
                body = response.json()
                detail = body if "message" in body else body.get("detail", body)
            except ValueError:
                detail = response.text
            raise MemsweepAPIError(response.status_code, detail, method, path)
        return response.json()

    # ----- studies -----------------------------------------------------------------------------------
    def submit(
        self,
        spec: str | Mapping[str, Any] | Any,
        idempotency_key: str | None = None,
        **overrides: Any,
    ) -> dict[str, Any]:
        """Create a study: a preset name, a spec dict or a `StudySpec`, with field overrides.

        A key is generated when none is given, so a retried submit never makes a second study."""
        if isinstance(spec, str):
            data: dict[str, Any] = {"preset": spec}
        elif isinstance(spec, Mapping):
            data = dict(spec)
        else:  # a StudySpec
            data = spec.model_dump(mode="json", exclude_unset=True)
        data.update(overrides)
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

    def get(self, study_id: str) -> dict[str, Any]:
        """State, counts, ETA and MLflow links."""
        result: dict[str, Any] = self._call("GET", f"/studies/{study_id}")
        return result

    def studies(self, state: str | None = None, limit: int = 50) -> list[dict[str, Any]]:
        params: dict[str, Any] = {"limit": limit, **({"state": state} if state else {})}
        items: list[dict[str, Any]] = self._call("GET", "/studies", params=params)["items"]
        return items

    def wait(
        self, study_id: str, poll: float = 2.0, timeout: float | None = None, progress: bool = True
    ) -> dict[str, Any]:
        """Poll until the study is done, failed or cancelled (a rich progress bar unless progress=False)."""
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

        deadline = None if timeout is None else time.monotonic() + timeout
        with Progress(
            TextColumn(f"[bold]study {study_id}"), BarColumn(), MofNCompleteColumn(),
            TextColumn("{task.fields[info]}"), TimeElapsedColumn(), disable=not progress,
        ) as bar:  # fmt: skip
            task = bar.add_task("study", total=None, info="")
            while True:
                study = self.get(study_id)
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
        result: dict[str, Any] = self._call("POST", f"/studies/{study_id}/cancel")
        return result

    def resume(self, study_id: str) -> dict[str, Any]:
        result: dict[str, Any] = self._call("POST", f"/studies/{study_id}/resume")
        return result

    def sync(self, study_id: str) -> dict[str, Any]:
        """Rebuild the study's MLflow runs from the ledger (after MLflow was down or lost its store)."""
        result: dict[str, Any] = self._call("POST", f"/studies/{study_id}/sync")
        return result

    def extend(self, study_id: str, **changes: Any) -> dict[str, Any]:
        """Add seeds / dims values / models / max_trials; returns {"added", "study"}."""
        result: dict[str, Any] = self._call("POST", f"/studies/{study_id}/extend", json=changes)
        return result

    # ----- answers -----------------------------------------------------------------------------------
    def best(self, study_id: str, k: int = 5, model: str | None = None) -> list[dict[str, Any]]:
        params: dict[str, Any] = {"k": k, **({"model": model} if model else {})}
        result: list[dict[str, Any]] = self._call("GET", f"/studies/{study_id}/best", params=params)
        return result

    def success(
        self,
        study_id: str,
        fraction: float | None = None,
        threshold: float | None = None,
        baseline: str | None = None,
        at_step: int | None = None,
    ) -> dict[str, Any]:
        """The raw success table {"criterion", "at_step", "total", "by_model", "by_value"}: under the
        study's criterion, or the fraction / threshold / reference baseline given, at the end of each
        run or at a budget of `at_step` steps (a recount: nothing trains)."""
        query = {"fraction": fraction, "threshold": threshold, "baseline": baseline, "at_step": at_step}
        params = {k: v for k, v in query.items() if v is not None}
        result: dict[str, Any] = self._call("GET", f"/studies/{study_id}/success", params=params)
        return result

    def success_vs_budget(self, study_id: str) -> dict[str, Any]:
        """Successes per model against training steps: {"criterion", "steps", "by_model": {model: [cells]}}."""
        result: dict[str, Any] = self._call("GET", f"/studies/{study_id}/success/budget")
        return result

    def success_table(
        self, study_id: str, by: Literal["model", "value"] = "model", **criterion: Any
    ) -> pd.DataFrame:
        """Successes with 95 % Wilson intervals: one row per model, or per (model, field, value);
        `criterion`: fraction / threshold / baseline / at_step as for `success`. The frame's `attrs`
        name the criterion and the budget."""
        import pandas as pd

        table = self.success(study_id, **criterion)
        rows: list[dict[str, Any]] = []
        if by == "model":
            for model, cell in table["by_model"].items():
                rows.append({"model": model, **_flat(cell)})
            frame = pd.DataFrame(rows, columns=["model", *CELL_COLUMNS]).set_index("model")
        else:
            for model, fields in table["by_value"].items():
                for field, values in fields.items():
                    for value, cell in values.items():
                        rows.append({"model": model, "field": field, "value": value, **_flat(cell)})
            frame = pd.DataFrame(rows, columns=["model", "field", "value", *CELL_COLUMNS])
            frame = frame.set_index(["model", "field", "value"])
        frame.attrs.update(criterion=table["criterion"]["name"], at_step=table["at_step"])
        return frame

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
        query: dict[str, Any] = {"sort": sort, "order": order, "history": history}
        if status is not None:
            query["status"] = [status] if isinstance(status, str) else list(status)
        if success is not None:
            query["success"] = success
        if model is not None:
            query["model"] = [model] if isinstance(model, str) else list(model)
        if params:
            query["param"] = [f"{k}={v:g}" if isinstance(v, float) else f"{k}={v}" for k, v in params.items()]
        offset, seen = 0, 0
        while True:
            size = page if limit is None else min(page, limit - seen)
            if size <= 0:
                return
            body = self._call(
                "GET", f"/studies/{study_id}/trials", params={**query, "offset": offset, "limit": size}
            )
            yield from body["items"]
            seen += len(body["items"])
            offset += len(body["items"])
            if not body["items"] or offset >= body["total"]:
                return

    # ----- the rest ----------------------------------------------------------------------------------
    def presets(self) -> list[dict[str, Any]]:
        result: list[dict[str, Any]] = self._call("GET", "/presets")
        return result

    def preset(self, name: str) -> dict[str, Any]:
        result: dict[str, Any] = self._call("GET", f"/presets/{name}")
        return result

    def health(self) -> dict[str, Any]:
        result: dict[str, Any] = self._call("GET", "/health")
        return result

    def ready(self) -> dict[str, Any]:
        """{"ready", "checks"}; a server that is not ready answers 503, returned here, not raised."""
        response = self._http.get("/ready", headers=self._headers)
        if response.status_code not in (200, 503):
            raise MemsweepAPIError(response.status_code, response.text, "GET", "/ready")
        result: dict[str, Any] = response.json()
        return result


CELL_COLUMNS = ["trials", "finished", "failed", "succeeded", "rate", "ci95_low", "ci95_high"]


def _flat(cell: Mapping[str, Any]) -> dict[str, Any]:
    out = {k: cell[k] for k in CELL_COLUMNS[:5]}
    out["ci95_low"], out["ci95_high"] = cell["ci95"]
    return out
