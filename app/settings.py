"""The one settings object for API, worker and CLI (environment prefix TIDE_)."""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

from extension.models import ModelSources


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="TIDE_", env_file=".env", extra="ignore")

    data_dir: Path = Field(Path("data"), description="Root for all state unless a part is pointed elsewhere")
    cache_dir: Path | None = Field(None, description="Converted built-in models (default DATA_DIR/cache)")
    models_dir: Path | None = Field(None, description="Folder of saved HF models offered by name (default DATA_DIR/models)")
    allow_hub: bool = Field(False, description="Accept Hugging Face hub ids as base_model (needs internet)")
    hf_token: str | None = Field(None, description="Token for gated hub models when allow_hub is on")

    @property
    def resolved_cache_dir(self) -> Path:
        return self.cache_dir or self.data_dir / "cache"

    @property
    def resolved_models_dir(self) -> Path:
        return self.models_dir or self.data_dir / "models"

    def model_sources(self) -> ModelSources:
        return ModelSources(
            cache_dir=self.resolved_cache_dir,
            models_dir=self.resolved_models_dir,
            allow_hub=self.allow_hub,
            hub_token=self.hf_token,
        )


@lru_cache
def get_settings() -> Settings:
    return Settings()
