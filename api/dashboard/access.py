"""The API's key rules in a browser's terms, without cookies or sessions to steal.

- Writes (the new-plan form) need a key once any key exists, exactly like `POST /api/v1/plans`: the form
  then shows an "API key" field, checked on every submission and never stored.
- Reads are open, unless `FSDP_PLANNER_REQUIRE_KEY_FOR_READS` is set (and a key exists): then pages ask
  through the browser's own login prompt (HTTP Basic: any user name, the API key as password), and the
  key given there also authorises the form.
- Every form post must come from the dashboard's own pages (`refuse_cross_site_posts`), in every mode:
  a browser re-sends Basic credentials on a post that another site makes it send, and a server with no
  key at all may sit on a network that only the victim's browser can reach.
"""

from __future__ import annotations

import base64

from fastapi import Request
from sqlalchemy.orm import Session
from starlette.exceptions import HTTPException as StarletteHTTPException

from api import keys
from api.cross_site import cross_site_sender
from api.deps import SessionDep

BASIC_CHALLENGE = {"WWW-Authenticate": 'Basic realm="fsdp-planner", charset="UTF-8"'}


def basic_auth_key(request: Request) -> str | None:
    """The password of an `Authorization: Basic` header (the API key), if any."""
    scheme, _, encoded = request.headers.get("authorization", "").partition(" ")
    if scheme.lower() != "basic" or not encoded:
        return None
    try:
        # Header values arrive as latin-1 text: any byte may be in them, and b64decode refuses a str
        # with non-ASCII characters with a plain ValueError (binascii.Error is one too).
        decoded = base64.b64decode(encoded.strip(), validate=True).decode("utf-8")
    except ValueError:  # not base64, or not UTF-8 (UnicodeDecodeError): no credentials, so a 401
        return None
    _, separator, password = decoded.partition(":")
    return password if separator and password else None


def require_read_access(request: Request, session: SessionDep) -> None:
    """Router dependency: the API's read rule, with the key from the browser's login prompt."""
    try:
        if not request.app.state.settings.require_key_for_reads or not keys.any_active_key(session):
            return
        key = basic_auth_key(request)
        if key is None or keys.verify_key(session, key) is None:
            raise StarletteHTTPException(
                401, "This server requires an API key to read plans. Sign in with any user name and your API "
                "key as the password (an administrator creates keys with `fsdp-planner keys create NAME`).",
                headers=BASIC_CHALLENGE,
            )
    finally:
        session.commit()  # hand the pooled connection back before the page's own work (see api.deps)


def write_key_required(session: Session, request: Request) -> bool:
    """Whether the new-plan form must ask for a key: keys exist and the browser has not signed in with one."""
    if not keys.any_active_key(session):
        return False
    signed_in = basic_auth_key(request)
    return signed_in is None or keys.verify_key(session, signed_in) is None


def write_key_error(session: Session, request: Request, form_key: str) -> str | None:
    """Why the form's submission may not write (a message for the key field), or None if it may."""
    if not write_key_required(session, request):
        return None
    if not form_key.strip():
        return ("This server requires an API key to create plans; paste yours here "
                "(an administrator creates one with `fsdp-planner keys create NAME`).")
    if keys.verify_key(session, form_key.strip()) is None:
        return "This API key is unknown or revoked; ask for a new one (`fsdp-planner keys create NAME`)."
    return None


def refuse_cross_site_posts(request: Request) -> None:
    """Router dependency: a 403 page for a form post (any unsafe method) that another site's page sent
    (api/cross_site.py: the check the JSON API's writes pass too)."""
    sender = cross_site_sender(request.method, request.headers)
    if sender is not None:
        raise StarletteHTTPException(
            403, f"This form was sent from another site ({sender}), so nothing was saved. The planner only "
            "accepts forms sent from its own pages: open the form on this server and submit it there.",
        )
