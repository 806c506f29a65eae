"""A stack's secrets, generated on first use into files of mode 600, never fixed, never printed:
the API's JWT and session keys, the Fernet key of connection extras, the metrics scrape token, the
metadata database's password, and one user per role (streamops.access) with its password.

The local stacks (LocalAirflow) keep them in their Airflow home; `docker/compose.yaml` runs
`streamops stack-secrets` once, into its `airflow-auth` volume, and every container reads them from
there (Airflow through its `_CMD` options, PostgreSQL through POSTGRES_PASSWORD_FILE).
"""

from __future__ import annotations

import json
import os
import secrets
from pathlib import Path

from streamops.access import ROLES

USERS_FILE = "users.json"


def write_once(path: Path, text: str, mode: int = 0o600) -> None:
    """`text` into a new file of `mode`; the first writer wins (two commands starting at once)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{secrets.token_hex(8)}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
    with os.fdopen(fd, "w") as out:
        out.write(text)
    os.chmod(tmp, mode)  # whatever the umask
    try:
        os.link(tmp, path)
    except FileExistsError:
        pass
    finally:
        tmp.unlink()


def secret(directory: Path, name: str, mode: int = 0o600) -> str:
    """The secret `name` of the stack in `directory`, generated the first time."""
    path = Path(directory) / name
    if not path.exists():
        write_once(path, secrets.token_urlsafe(32), mode)
    return path.read_text().strip()


def fernet_key(directory: Path) -> str:
    """The Fernet key connection extras are encrypted with, generated the first time."""
    from cryptography.fernet import Fernet

    path = Path(directory) / "fernet_key"
    if not path.exists():
        write_once(path, Fernet.generate_key().decode())
    return path.read_text().strip()


def users(directory: Path) -> dict[str, dict[str, str]]:
    """One user per role, named as the role: name -> {"role", "password"}; generated the first time."""
    path = Path(directory) / USERS_FILE
    if not path.exists():
        generated = {name: {"role": name, "password": secrets.token_urlsafe(12)} for name in ROLES}
        write_once(path, json.dumps(generated, indent=2) + "\n")
    return read_users(path)


def read_users(path: Path) -> dict[str, dict[str, str]]:
    """A users file as `users` writes it (FileNotFoundError when there is none yet)."""
    return json.loads(Path(path).read_text())


def compose_secrets(directory: Path, database_host: str, database: str = "airflow", owner: int | None = None,
                    users_directory: Path | None = None) -> list[str]:
    """Every secret of the compose stack in `directory` (its `airflow-auth` volume), made once: the
    files and what each is for. The database password goes to `postgres-password`, readable by the
    database's container (mode 644 in a volume only the stack's own containers mount); the URL
    Airflow connects with, to `sql_alchemy_conn`. `owner`: the uid the Airflow containers run as.
    `users_directory`: where the users file goes instead (a volume only the init container mounts:
    task code must not read the approver's password)."""
    directory = Path(directory)
    users_directory = Path(users_directory) if users_directory is not None else directory
    made = {"jwt_secret": "the API's JWT signing key", "api_secret_key": "the UI's session key"}
    for name in made:
        secret(directory, name)
    secret(directory, "metrics-token", mode=0o644)  # Prometheus' container reads it as its own user
    fernet_key(directory)
    users(users_directory)
    password = secret(directory, "postgres-password", mode=0o644)
    if not (directory / "sql_alchemy_conn").exists():
        write_once(directory / "sql_alchemy_conn",
                   f"postgresql+psycopg2://airflow:{password}@{database_host}:5432/{database}\n")
    if owner is not None:
        for path in [*directory.iterdir(), users_directory / USERS_FILE]:
            os.chown(path, owner, -1)
    said = {**made, "metrics-token": "Prometheus' scrape token", "fernet_key": "connection extras' encryption key",
            USERS_FILE: "one user per role, generated passwords", "postgres-password": "the metadata database's password",
            "sql_alchemy_conn": "Airflow's database URL"}
    return [f"{(users_directory if name == USERS_FILE else directory) / name}: {what}" for name, what in said.items()]
