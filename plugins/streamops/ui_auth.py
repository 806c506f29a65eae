"""The Airflow UI's login for the suite's own pages (apps page, Data Docs, metrics).

Airflow mounts a plugin's FastAPI app but does not authenticate it: each app asks for a login
itself through these helpers. A request carries the login as the UI's cookie (a browser) or as
`Authorization: Bearer <JWT>` (a script with a token from /auth/token). A browser without a login
is sent to the login page and back; anything else gets a 401 naming what to send.
"""


from typing import Any


class LoginRequired(Exception):
    """No (valid) login: the caller turns it into a redirect or a 401."""


def bearer_token(request: Any) -> str | None:
    header = request.headers.get("authorization", "")
    return header[7:].strip() or None if header[:7].lower() == "bearer " else None


async def logged_in_user(request: Any, credential: str | None = None) -> str:
    """The name of the logged-in user, from `credential` or the request's bearer token or UI
    cookie. A missing login raises LoginRequired; a forged or expired one Airflow's own 401/403."""
    from airflow.api_fastapi.auth.managers.base_auth_manager import COOKIE_NAME_JWT_TOKEN
    from airflow.api_fastapi.core_api.security import resolve_user_from_token

    credential = credential or bearer_token(request) or request.cookies.get(COOKIE_NAME_JWT_TOKEN)
    if not credential:
        raise LoginRequired
    user = await resolve_user_from_token(credential)
    return user.get_name()


def wants_html(request: Any) -> bool:
    return "text/html" in request.headers.get("accept", "")


def login_url(request: Any) -> str:
    """The UI's login page, coming back to this page after the login."""
    from airflow.api_fastapi.app import get_auth_manager

    return get_auth_manager().get_url_login(next_url=str(request.url))


def page_login(what: str):
    """A FastAPI dependency for a page: the user's name, a redirect to the login for a browser,
    or a 401 for anything else. `what` names the page in the 401."""
    from fastapi import HTTPException, Request

    async def dependency(request: Request) -> str:
        try:
            return await logged_in_user(request)
        except LoginRequired:
            if wants_html(request):
                raise HTTPException(status_code=307, headers={"Location": login_url(request)},
                                    detail="Log in to Airflow first") from None
            raise HTTPException(status_code=401, headers={"WWW-Authenticate": "Bearer"},
                                detail=f"Not authenticated: {what} needs an Airflow login (the UI's cookie, or "
                                       "'Authorization: Bearer <token>' from POST /auth/token)") from None
        except HTTPException as exc:
            # An expired or forged cookie: a browser logs in again instead of reading a JSON error.
            if wants_html(request) and exc.status_code in (401, 403):
                raise HTTPException(status_code=307, headers={"Location": login_url(request)},
                                    detail="Log in to Airflow again") from None
            raise

    return dependency
