"""The one settings class, read from the environment (prefix MEMSWEEP_) and validated at start-up."""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path
from typing import Annotated, Any

from pydantic import Field, SecretStr, field_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

#: the variables of the settings that hold secrets (the API's token; the ledger's URL, which may hold its
#: database's password): no process that runs others' code (a Ray worker: a trial's cell, a plugin) may
#: inherit them (`service.study.nodes` starts the embedded Ray without them)
SECRET_VARIABLES = ("MEMSWEEP_API_TOKEN", "MEMSWEEP_DATABASE_URL")


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="MEMSWEEP_", env_file=".env", extra="ignore")

    home: Path = Field(
        default=Path.home() / ".memsweep", description="where the ledger, Ray results and MLflow data live"
    )
    database_url: str | None = Field(
        default=None, description="SQLAlchemy URL of the ledger; default: SQLite in home"
    )
    ray_address: str | None = Field(
        default=None, description="join this Ray cluster (else RAY_ADDRESS, else embedded)"
    )
    ray_num_cpus: int | None = Field(
        default=None,
        description="CPUs of the embedded Ray (default: those this process may use, its affinity at most its "
        "cgroup's quota)",
    )
    mlflow_tracking_uri: str | None = Field(
        default=None, description="an MLflow server; default: start one on loopback"
    )
    mlflow_port: int = Field(default=5005, description="port of the MLflow server started on loopback")
    mlflow_experiment: str = Field(default="memsweep", description="MLflow experiment that holds the studies")
    mlflow_ui_url: str | None = Field(
        default=None, description="MLflow as users' browsers reach it, for links (default: the tracking URI)"
    )
    mlflow_live_interval: float = Field(
        default=2.0,
        ge=0.0,
        description="seconds between two writes of a training trial's live child run: it is made this long "
        "after its trial starts, and its curve written at most this often (less often when over 20 runs are "
        "live); a trial that ends sooner is written whole at its end (four requests: MLflow's writes are "
        "the tail of short-trial studies)",
    )
    mlflow_repair_interval: float = Field(
        default=60.0,
        gt=0.0,
        description="seconds between two looks of `memsweep serve` at MLflow: a local server it started that "
        "died is started again (waiting twice as long after each failed start, up to 10 minutes), and the "
        "runs of studies whose MLflow writes failed are made again from the ledger once MLflow answers",
    )
    max_grid_size: int = Field(default=50_000, description="largest number of trials one study may hold")
    trial_attempts: int = Field(
        default=3,
        ge=1,
        description="starts of a trial in one run of its study before an infrastructure fault (its worker, "
        "node or process died) leaves it as error",
    )

    # ----- the REST service (`memsweep serve`) and its clients -------------------------------------
    host: str = Field(default="127.0.0.1", description="address `memsweep serve` binds")
    port: int = Field(default=8000, ge=1, le=65535, description="port `memsweep serve` listens on")
    api_token: SecretStr | None = Field(
        default=None,
        description="bearer token every route but /health requires (server), and that clients send",
    )
    api_url: str | None = Field(default=None, description="the server `memsweep submit/status --url` asks")
    cors_origins: Annotated[list[str], NoDecode] = Field(
        default_factory=list, description="origins allowed by CORS, comma-separated; none by default"
    )
    max_request_bytes: int = Field(default=1_000_000, ge=1_000, description="largest request body accepted")
    max_parallel_studies: int = Field(
        default=2, ge=0, description="studies the server runs at once (0: accept and queue, run none)"
    )

    @field_validator("home")
    @classmethod
    def _absolute_home(cls, v: Path) -> Path:
        """`~/msw` (quoted in a .env or compose file, so no shell expands it) and a relative home were
        taken as written: a literal `./~` folder, a ledger that moved with the working directory, and
        the MLflow server (started in its folder) resolving the path a second time."""
        return v.expanduser().resolve()

    @field_validator("cors_origins", mode="before")
    @classmethod
    def _split_origins(cls, v: Any) -> Any:
        if isinstance(v, str):
            return [o.strip() for o in v.split(",") if o.strip()]
        return v

    def resolved_database_url(self) -> str:
        return self.database_url or f"sqlite:///{self.home / 'ledger.db'}"


@lru_cache
def get_settings() -> Settings:
    return Settings()
