"""A stack's secrets (streamops.stack_secrets): generated once, never fixed, kept on later starts,
each readable only by whom it is for."""

from __future__ import annotations

import json
import stat

from streamops.stack_secrets import compose_secrets


def mode(path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_the_compose_secrets_are_made_once_and_kept(tmp_path):
    said = compose_secrets(tmp_path, "postgres")
    files = {path.name: path.read_text() for path in tmp_path.iterdir()}
    assert sorted(files) == ["api_secret_key", "fernet_key", "jwt_secret", "metrics-token", "postgres-password",
                             "sql_alchemy_conn", "users.json"]
    assert len(said) == len(files) and all(line.startswith(str(tmp_path)) for line in said)
    assert {name: mode(tmp_path / name) for name in files} == {
        **{name: 0o600 for name in files}, "postgres-password": 0o644, "metrics-token": 0o644}  # read by their containers
    users = json.loads(files["users.json"])
    assert {name: user["role"] for name, user in users.items()} == {
        "viewer": "viewer", "operator": "operator", "approver": "approver", "admin": "admin"}
    passwords = [user["password"] for user in users.values()]
    assert len(set(passwords)) == 4 and all(len(p) >= 16 for p in passwords)
    password = files["postgres-password"].strip()
    assert files["sql_alchemy_conn"] == f"postgresql+psycopg2://airflow:{password}@postgres:5432/airflow\n"
    assert len({files[n].strip() for n in ("api_secret_key", "jwt_secret", "metrics-token", "postgres-password")}) == 4

    compose_secrets(tmp_path, "postgres")  # a later start keeps every one
    assert {path.name: path.read_text() for path in tmp_path.iterdir()} == files
    other = tmp_path / "other"
    compose_secrets(other, "postgres")
    assert (other / "jwt_secret").read_text() != files["jwt_secret"]  # generated, never fixed


def test_the_users_file_can_live_apart_from_the_other_secrets(tmp_path):
    said = compose_secrets(tmp_path / "auth", "postgres", users_directory=tmp_path / "users")
    assert not (tmp_path / "auth" / "users.json").exists() and (tmp_path / "users" / "users.json").exists()
    assert f"{tmp_path / 'users' / 'users.json'}: one user per role, generated passwords" in said
