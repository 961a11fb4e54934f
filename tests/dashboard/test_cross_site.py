"""Dashboard forms refuse posts that another site's page sent (issue 22, item 8).

A browser signed in through the Basic prompt re-sends its credentials on any request to this server,
including a form post that evil.example makes it send; and a server with no key may sit on a network
only the victim's browser can reach. Every dashboard POST, in every key mode, checks the browser's
Fetch metadata (`Sec-Fetch-Site`) or, lacking it, `Origin` against the request's own Host.
"""

from __future__ import annotations

import base64
import html as html_module
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
from fastapi.testclient import TestClient

from api import keys
from api.app import create_app
from api.db.session import create_db_engine, create_session_factory
from api.settings import Settings
from tests.dashboard.conftest import DEBUG_CPU_FORM, GPT2_FORM, create_plan
from tests.dashboard.test_pages import HTML
from tests.dashboard.test_study_pages import STUDY_FORM

# TestClient sends `Host: testserver`.
OWN_ORIGIN = "http://testserver"
CROSS_SITE = [
    {"Origin": "https://evil.example", "Sec-Fetch-Site": "cross-site"},  # what a current browser sends
    {"Origin": "https://evil.example"},  # a browser without Fetch metadata
    {"Origin": "null"},  # a sandboxed frame or a redirect chain hides the sender
    {"Origin": "http://testserver.evil.example"},
    {"Origin": "http://testserver:8080"},  # another port is another origin
    {"Sec-Fetch-Site": "same-site", "Origin": "https://other.testserver"},  # a sibling subdomain
    {"Sec-Fetch-Site": "cross-site", "Origin": OWN_ORIGIN},  # Fetch metadata wins over Origin
]
SAME_ORIGIN = [
    {"Origin": OWN_ORIGIN, "Sec-Fetch-Site": "same-origin"},  # the dashboard's own form, in a browser
    {"Origin": OWN_ORIGIN},
    {"Origin": "HTTP://TESTSERVER"},
    {"Sec-Fetch-Site": "none"},  # the user's own doing (e.g. a resubmitted page)
    {},  # curl and scripts send neither header
]
SMALL_STUDY = {**STUDY_FORM, "gpu": ["H100-SXM-80GB"], "sizes": "1,8"}
MODES = ["open", "form key", "basic sign-in"]


def basic(key: str) -> dict[str, str]:
    return {"Authorization": "Basic " + base64.b64encode(f"me:{key}".encode()).decode()}


@dataclass
class Browser:
    """A client in one key mode, sending what a signed-in browser sends with every form: the form's key
    field (keys exist) or its Basic credentials (key-protected reads), so that only the sender decides."""

    client: TestClient
    form_key: dict[str, str]
    auth: dict[str, str]
    api_auth: dict[str, str]

    def post(self, path: str, form: dict[str, object], headers: dict[str, str]) -> httpx.Response:
        return self.client.post(path, data={**form, **self.form_key},
                                headers={**HTML, **self.auth, **headers}, follow_redirects=False)

    def counts(self) -> tuple[int, int]:
        """(plans, studies) stored."""
        plans = self.client.get("/api/v1/plans", headers=self.api_auth).json()["items"]
        studies = self.client.get("/api/v1/studies", headers=self.api_auth).json()["items"]
        return len(plans), len(studies)


@pytest.fixture(params=MODES)
def browser_in_mode(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Browser]:
    settings = Settings(data_dir=tmp_path, require_key_for_reads=request.param == "basic sign-in")
    with TestClient(create_app(settings)) as client:
        if request.param == "open":
            yield Browser(client, {}, {}, {})
            return
        engine = create_db_engine(settings.resolved_database_url)
        with create_session_factory(engine)() as session:
            key = keys.create_key(session, "browser").key
        engine.dispose()
        bearer = {"Authorization": f"Bearer {key}"}
        if request.param == "form key":
            yield Browser(client, {"api_key": key}, {}, bearer)
        else:
            yield Browser(client, {}, basic(key), bearer)


@pytest.mark.parametrize("headers", CROSS_SITE)
def test_a_cross_site_form_post_is_refused_and_creates_nothing(
    browser_in_mode: Browser, headers: dict[str, str]
) -> None:
    for path, form in (("/plans/new", GPT2_FORM), ("/studies/new", SMALL_STUDY),
                       ("/plans/1/replan", {"run_id": "1"})):
        response = browser_in_mode.post(path, form, headers)
        assert response.status_code == 403, (path, response.text)
        assert response.headers["content-type"].startswith("text/html")
        assert "This form was sent from another site" in html_module.unescape(response.text)
    assert browser_in_mode.counts() == (0, 0)


@pytest.mark.parametrize("headers", SAME_ORIGIN)
def test_a_form_post_from_the_dashboard_itself_still_works(
    browser_in_mode: Browser, headers: dict[str, str]
) -> None:
    created = browser_in_mode.post("/plans/new", DEBUG_CPU_FORM, headers)
    assert created.status_code == 303, created.text
    assert browser_in_mode.counts() == (1, 0)
    study = browser_in_mode.post("/studies/new", SMALL_STUDY, headers)
    assert study.status_code == 303, study.text
    assert browser_in_mode.counts()[1] == 1


def test_the_issue_case_a_signed_in_browser_on_evil_example(tmp_path: Path) -> None:
    """Exactly as found: Basic credentials, `Origin: https://evil.example`, cross-site, no form key."""
    settings = Settings(data_dir=tmp_path, require_key_for_reads=True)
    with TestClient(create_app(settings)) as client:
        engine = create_db_engine(settings.resolved_database_url)
        with create_session_factory(engine)() as session:
            issued = keys.create_key(session, "victim")
        engine.dispose()
        evil = {"Origin": "https://evil.example", "Sec-Fetch-Site": "cross-site"}
        refused = client.post("/plans/new", data=GPT2_FORM, headers={**basic(issued.key), **evil},
                              follow_redirects=False)
        assert refused.status_code == 403
        listed = client.get("/api/v1/plans", headers={"Authorization": f"Bearer {issued.key}"})
        assert listed.json()["items"] == []
        # The same browser on the dashboard's own page.
        own = {"Origin": OWN_ORIGIN, "Sec-Fetch-Site": "same-origin"}
        created = client.post("/plans/new", data=GPT2_FORM, headers={**basic(issued.key), **own},
                              follow_redirects=False)
        assert created.status_code == 303


def test_pages_open_from_other_sites_and_json_clients_get_a_problem(client: TestClient) -> None:
    plan_id = create_plan(client)
    evil = {"Origin": "https://evil.example", "Sec-Fetch-Site": "cross-site"}
    # A link from another site is a GET: pages still open.
    for path in ("/", f"/plans/{plan_id}", "/plans/new", "/studies/new"):
        assert client.get(path, headers=evil).status_code == 200, path
    as_json = client.post("/plans/new", data=GPT2_FORM, headers={**evil, "Accept": "application/json"})
    assert as_json.status_code == 403 and as_json.headers["content-type"] == "application/problem+json"
