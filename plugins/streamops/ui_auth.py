"""The Airflow UI's login and roles for the suite's own pages (apps page, driver logs, Data Docs,
metrics).

Airflow mounts a plugin's FastAPI app but does not authenticate it: each app asks for a login
itself through these helpers. A request carries the login as the UI's cookie (a browser) or as
`Authorization: Bearer <JWT>` (a script with a token from /auth/token). A browser without a login
is sent to the login page and back; anything else gets a 401 naming what to send. A login whose
role may not read the page (streamops.access.PAGES, asked of the auth manager as a custom view)
gets a 403 naming the roles that may.
"""


from typing import Any

from streamops.access import roles_allowed


class LoginRequired(Exception):
    """No (valid) login: the caller turns it into a redirect or a 401."""


def bearer_token(request: Any) -> str | None:
    header = request.headers.get("authorization", "")
    return header[7:].strip() or None if header[:7].lower() == "bearer " else None


async def logged_in_user(request: Any, credential: str | None = None) -> Any:
    """The logged-in user (the auth manager's), from `credential` or the request's bearer token or
    UI cookie. A missing login raises LoginRequired; a forged or expired one Airflow's own 401/403."""
    from airflow.api_fastapi.auth.managers.base_auth_manager import COOKIE_NAME_JWT_TOKEN
    from airflow.api_fastapi.core_api.security import resolve_user_from_token

    credential = credential or bearer_token(request) or request.cookies.get(COOKIE_NAME_JWT_TOKEN)
    if not credential:
        raise LoginRequired
    return await resolve_user_from_token(credential)


def may_read(user: Any, page: str) -> bool:
    """May `user` read the suite's `page` (a streamops.access page), as its role says?"""
    from airflow.api_fastapi.app import get_auth_manager

    return bool(get_auth_manager().is_authorized_custom_view(method="GET", resource_name=page, user=user))


def forbidden(user: Any, what: str, page: str) -> Exception:
    """The 403 of a login whose role may not read `page`."""
    from fastapi import HTTPException

    return HTTPException(status_code=403, detail=f"Forbidden: {what} is open to the roles {', '.join(roles_allowed(page))}; "
                                                 f"{user.get_name()} has none of them (an admin can change a user's roles)")


def wants_html(request: Any) -> bool:
    return "text/html" in request.headers.get("accept", "")


def login_url(request: Any) -> str:
    """The UI's login page, coming back to this page after the login."""
    from airflow.api_fastapi.app import get_auth_manager

    return get_auth_manager().get_url_login(next_url=str(request.url))


def may_trigger(user: Any, dag_id: str) -> bool:
    """May `user` trigger `dag_id`, as its role says (what Airflow's REST API checks)?"""
    from airflow.api_fastapi.app import get_auth_manager
    from airflow.api_fastapi.auth.managers.models.resource_details import DagAccessEntity, DagDetails

    return bool(get_auth_manager().is_authorized_dag(method="POST", access_entity=DagAccessEntity.RUN,
                                                     details=DagDetails(id=dag_id), user=user))


def page_login(what: str, page: str):
    """A FastAPI dependency for one of the suite's pages (`page`, a streamops.access page): the
    user's name; a redirect to the login for a browser, or a 401 for anything else; a 403 for a
    role that may not read it. `what` names the page in the answers."""
    from fastapi import Depends

    user_of = page_user(what, page)

    async def dependency(user: Any = Depends(user_of)) -> str:  # noqa: B008
        return str(user.get_name())

    return dependency


def page_user(what: str, page: str):
    """As page_login, the logged-in user itself (the auth manager's: for further role checks)."""
    from fastapi import HTTPException, Request

    async def dependency(request: Request) -> Any:
        try:
            user = await logged_in_user(request)
            if not may_read(user, page):
                raise forbidden(user, what, page)
            return user
        except LoginRequired:
            if wants_html(request):
                raise HTTPException(status_code=307, headers={"Location": login_url(request)},
                                    detail="Log in to Airflow first") from None
            raise HTTPException(status_code=401, headers={"WWW-Authenticate": "Bearer"},
                                detail=f"Not authenticated: {what} needs an Airflow login (the UI's cookie, or "
                                       "'Authorization: Bearer <token>' from POST /auth/token)") from None
        except HTTPException as exc:
            # An expired or forged cookie: a browser logs in again instead of reading a JSON error.
            if wants_html(request) and exc.status_code in (401, 403) and not str(exc.detail).startswith("Forbidden: "):
                raise HTTPException(status_code=307, headers={"Location": login_url(request)},
                                    detail="Log in to Airflow again") from None
            raise

    return dependency
