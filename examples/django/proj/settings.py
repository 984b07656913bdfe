"""Minimal settings: one PostgreSQL database (psycopg 3), shared by Django and pgtasks."""

from __future__ import annotations

import os

import psycopg

_url = os.environ.get("DATABASE_URL", "postgresql://postgres@127.0.0.1/postgres")
_params = psycopg.conninfo.conninfo_to_dict(_url)

SECRET_KEY = "example-only"
DEBUG = False
USE_TZ = True
INSTALLED_APPS = ["examples.django.shop"]
DATABASES = {
    "default": {
        "ENGINE": "django.db.backends.postgresql",
        "NAME": _params.get("dbname", "postgres"),
        "USER": _params.get("user", ""),
        "PASSWORD": _params.get("password", ""),
        "HOST": _params.get("host", ""),
        "PORT": _params.get("port", ""),
    }
}

# pgtasks keeps its tasks in the same database, so rows written in atomic() share its fate.
CELERY_BROKER_URL = _url
CELERY_TASK_DEFAULT_QUEUE = "shop"
CELERY_SCHEMA_NAME = os.environ.get("PGTASKS_EXAMPLE_SCHEMA", "pgtasks")
