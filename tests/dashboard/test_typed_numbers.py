"""Ids and whole numbers typed into dashboard paths, query strings and forms (issue 22, item 4).

`'²'.isdigit()` is true and `int('²')` fails, so every page that checked with `isdigit()` answered 500;
`int('٣')` is 3, so an Arabic-Indic digit silently named another row. Each is now refused by the one
parser in `api.typed_numbers`, with a page that says why.
"""

from __future__ import annotations

import html as html_module

import pytest
from fastapi.testclient import TestClient

from api.schemas.plans import MAX_ID
from api.typed_numbers import parse_decimal, parse_id, parse_whole
from tests.dashboard.conftest import DEBUG_CPU_FORM, GPT2_FORM, create_plan
from tests.dashboard.test_pages import HTML, error_beside
from tests.dashboard.test_study_pages import field_errors as study_field_errors

SUPERSCRIPT_TWO = "\u00b2"
ARABIC_INDIC_ONE = "\u0661"  # int() reads it as 1
HUGE = "9" * 30


@pytest.mark.parametrize("raw", [SUPERSCRIPT_TWO, ARABIC_INDIC_ONE, "1\u00b2", "", " ", "-1", "+1", "1.0",
                                 "0x10", "1_0", "1 0", "\uff11", HUGE, "0" * 10_000 + "1" * 30])
def test_only_ascii_digits_in_range_are_numbers(raw: str) -> None:
    assert parse_whole(raw, low=0, high=10**20) is None
    assert parse_id(raw) is None


def test_ascii_digits_are_read_with_their_bounds() -> None:
    assert parse_whole(" 08 ", low=1, high=64) == 8
    assert parse_whole("0" * 1000 + "7", low=1, high=64) == 7
    assert parse_whole("65", low=1, high=64) is None and parse_whole("0", low=1, high=64) is None
    assert parse_id(str(MAX_ID)) == MAX_ID and parse_id(str(MAX_ID + 1)) is None and parse_id("0") is None


@pytest.mark.parametrize("path", [
    f"/plans/{SUPERSCRIPT_TWO}", f"/studies/{SUPERSCRIPT_TWO}", f"/calibrations/{SUPERSCRIPT_TWO}",
    f"/plans/{ARABIC_INDIC_ONE}", f"/plans/{HUGE}", f"/studies/{HUGE}", f"/calibrations/{HUGE}",
])
def test_a_path_id_that_is_not_ascii_digits_is_a_404_page(client: TestClient, path: str) -> None:
    create_plan(client)  # plan 1 exists: '١' must not open it
    response = client.get(path, headers=HTML)
    assert response.status_code == 404, response.text
    assert response.headers["content-type"].startswith("text/html")
    assert "ids are whole numbers from 1 to" in html_module.unescape(response.text)


@pytest.mark.parametrize("ids", [f"1,{SUPERSCRIPT_TWO}", f"1,{ARABIC_INDIC_ONE}", f"1,{HUGE}"])
def test_compare_refuses_ids_that_are_not_ascii_digits(client: TestClient, ids: str) -> None:
    create_plan(client)
    response = client.get("/compare", params={"ids": ids}, headers=HTML)
    assert response.status_code == 404
    assert "is not a plan id" in html_module.unescape(response.text)


@pytest.mark.parametrize(("query", "notice"), [
    ({"nodes": SUPERSCRIPT_TWO}, "Nodes must be a whole number"),
    ({"nodes": ARABIC_INDIC_ONE}, "Nodes must be a whole number"),
    ({"nodes": HUGE}, "Nodes must be a whole number"),
    ({"tp": SUPERSCRIPT_TWO}, "Tensor parallel must be a whole number"),
    ({"tp": HUGE}, "Tensor parallel must be a whole number"),
    ({"limit": SUPERSCRIPT_TWO}, "The page size must be a whole number"),
])
def test_plan_list_ignores_a_filter_that_is_not_a_number_and_says_so(
    client: TestClient, query: dict[str, str], notice: str
) -> None:
    create_plan(client)
    response = client.get("/", params=query)
    assert response.status_code == 200
    assert notice in response.text
    assert 'data-plan-id="1"' in response.text  # the filter was dropped, not applied


def test_plan_list_reads_ascii_filters_once(client: TestClient) -> None:
    create_plan(client)
    page = client.get("/", params={"nodes": "01", "tp": "1", "limit": HUGE})
    assert page.status_code == 200 and 'data-plan-id="1"' in page.text
    assert 'id="filter-nodes" min="1" inputmode="numeric" value="1"' in page.text
    assert client.get("/", params={"nodes": "2"}).text.count("data-plan-id=") == 0


@pytest.mark.parametrize("query", [
    {"page": SUPERSCRIPT_TWO}, {"page": ARABIC_INDIC_ONE}, {"page": HUGE}, {"page": str(MAX_ID)},
])
def test_calibrations_page_number_falls_back_to_the_first_page(
    client: TestClient, query: dict[str, str]
) -> None:
    assert client.get("/calibrations", params=query).status_code == 200


@pytest.mark.parametrize("cursor", [SUPERSCRIPT_TWO, ARABIC_INDIC_ONE, HUGE, "9223372036854775808"])
def test_studies_cursor_falls_back_to_the_newest(client: TestClient, cursor: str) -> None:
    assert client.get("/studies", params={"cursor": cursor}).status_code == 200


@pytest.mark.parametrize(("field", "value", "message"), [
    ("tensor_parallel_degree", SUPERSCRIPT_TWO, "enter a whole number from 1 to 1024"),
    ("tensor_parallel_degree", ARABIC_INDIC_ONE, "enter a whole number from 1 to 1024"),
    ("tensor_parallel_degree", HUGE, "enter a whole number from 1 to 1024"),
    ("num_nodes", ARABIC_INDIC_ONE, "enter the number of nodes as a whole number"),
    ("seq_len", SUPERSCRIPT_TWO, "enter the sequence length as a whole number"),
    ("calibration_id", SUPERSCRIPT_TWO, "choose a stored calibration profile"),
])
def test_plan_form_refuses_numbers_that_are_not_ascii_digits(
    client: TestClient, field: str, value: str, message: str
) -> None:
    response = client.post("/plans/new", data={**GPT2_FORM, field: value})
    assert response.status_code == 422, response.text
    assert message in error_beside(response.text, field, field)
    assert client.get("/api/v1/plans").json()["items"] == []


@pytest.mark.parametrize("run_id", [SUPERSCRIPT_TWO, ARABIC_INDIC_ONE, HUGE, "0"])
def test_replan_refuses_a_run_id_that_is_not_ascii_digits(client: TestClient, run_id: str) -> None:
    plan_id = create_plan(client, **DEBUG_CPU_FORM)
    response = client.post(f"/plans/{plan_id}/replan", data={"run_id": run_id}, headers=HTML)
    assert response.status_code == 422, response.text
    assert "is not a run id" in html_module.unescape(response.text)
    assert len(client.get("/api/v1/plans").json()["items"]) == 1


def test_study_form_refuses_a_seq_len_that_is_not_ascii_digits(client: TestClient) -> None:
    response = client.post("/studies/new", data={"model": "gpt2", "seq_len": ARABIC_INDIC_ONE})
    assert response.status_code == 422
    assert "enter the sequence length as a whole number" in html_module.unescape(response.text)


@pytest.mark.parametrize("raw", [SUPERSCRIPT_TWO, ARABIC_INDIC_ONE, "2.\u0664", "\u0661e3", "inf", "nan",
                                 "1e999", "", ".", "1.2.3", "0x10", "\uff11", "1" * 41])
def test_only_ascii_decimals_are_decimals(raw: str) -> None:
    assert parse_decimal(raw) is None


def test_ascii_decimals_are_read_with_their_bounds() -> None:
    assert parse_decimal(" 2.49 ") == 2.49 and parse_decimal(".5") == 0.5 and parse_decimal("1e3") == 1000.0
    assert parse_decimal("-1") == -1.0 and parse_decimal("-1", low=0) is None
    assert parse_decimal("3.", high=3) == 3.0 and parse_decimal("3.01", high=3) is None


# What the study form reads as text: prices and the deadline were read with float(), which takes '٣' for
# 3.0; the sizes with str.isdigit() and int(), which failed on '²' (a 500) and read '٣,٤' as [3, 4].
@pytest.mark.parametrize(("field", "message"), [
    ("price_H100-SXM-80GB", "enter the H100-SXM-80GB price per GPU-hour as a number"),
    ("deadline_days", "enter the deadline (days) as a number"),
    ("sizes", "; write a list (64,128,512), a doubling range (8-4096) or a stepped range (64-512:+64), in "
              "ASCII digits"),
    ("token_budget", "as a token count; write e.g. 15T"),
])
@pytest.mark.parametrize("digit", [SUPERSCRIPT_TWO, "\u0663"])
def test_study_form_refuses_numbers_in_other_scripts_digits(
    client: TestClient, field: str, message: str, digit: str
) -> None:
    form = {"model": "gpt2", "token_budget": "10B", "gpu": ["H100-SXM-80GB"], "price_H100-SXM-80GB": "2.5",
            "sizes": "8,16", "seq_len": "1024", "batch_rule": "fixed", "batch_tokens": "262144",
            "precision": "bf16", "deadline_days": "1"}
    value = f"{digit},{digit}" if field == "sizes" else digit
    response = client.post("/studies/new", data={**form, field: value}, follow_redirects=False)
    assert response.status_code == 422, response.status_code
    errors = {name: html_module.unescape(text) for name, text in study_field_errors(response.text).items()}
    assert message in errors.get(field, ""), errors
    assert client.get("/api/v1/studies").json()["items"] == []
