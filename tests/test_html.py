"""The leaderboard's index.html, driven in a real headless Chromium opened from a file:// URL.

Needs Debian's ``chromium`` and ``chromium-driver`` and the ``selenium`` package. Without them the
browser tests are skipped with a message, or fail when ``CI`` is set (CI must run them).
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from robustbench_nacl.report.html import embed_json
from robustbench_nacl.report.leaderboard import main_leaderboard, render_leaderboard
from robustbench_nacl.results.rows import ResultRow, load_rows, stamp_ids

ROWS = Path(__file__).parent / "data" / "leaderboard" / "rows"
CHROMIUM = Path("/usr/bin/chromium")
CHROMEDRIVER = Path("/usr/bin/chromedriver")
INSTALL = "install them with `apt-get install -y chromium chromium-driver` and `pip install 'selenium>=4'`"
WAIT_S = 10


@pytest.fixture(scope="module")
def site17(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The leaderboard of the seventeen demo-zoo lines (tests/data/leaderboard/families.py)."""
    sys.path.insert(0, str(ROWS.parent))
    import families

    written = render_leaderboard(families.make_rows(), tmp_path_factory.mktemp("site17"))
    records = json.loads(written["leaderboard.json"].read_text())["results"]
    return {"index": written["index.html"], "records": records}


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The rendered leaderboard: its index.html and the records it shows (in display order)."""
    written = main_leaderboard(ROWS, tmp_path_factory.mktemp("site"))
    records = json.loads(written["leaderboard.json"].read_text())["results"]
    return {"index": written["index.html"], "records": records}


def _missing() -> list[str]:
    missing = [str(p) for p in (CHROMIUM, CHROMEDRIVER) if not p.exists()]
    return missing + ([] if importlib.util.find_spec("selenium") else ["the selenium package"])


@pytest.fixture(scope="module")
def driver(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    missing = _missing()
    if missing:
        msg = f"browser tests need {', '.join(missing)}; {INSTALL}"
        if os.environ.get("CI"):
            pytest.fail(msg)
        pytest.skip(msg)
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    opts = webdriver.ChromeOptions()
    opts.binary_location = str(CHROMIUM)
    for arg in (
        "--headless=new",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-dev-shm-usage",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--no-first-run",
        "--window-size=1400,1000",
        f"--user-data-dir={tmp_path_factory.mktemp('chromium-profile')}",
    ):
        opts.add_argument(arg)
    # explicit driver path: Selenium Manager never runs, so nothing is downloaded
    drv = webdriver.Chrome(service=Service(executable_path=str(CHROMEDRIVER)), options=opts)
    drv.set_page_load_timeout(WAIT_S)
    try:
        yield drv
    finally:
        drv.quit()


@pytest.fixture
def page(driver: Any, site: dict[str, Any]) -> Any:
    """A freshly loaded page (no sort, filter or expanded row left over from another test)."""
    driver.get(site["index"].as_uri())
    return driver


def _ids(drv: Any) -> list[str]:
    return drv.execute_script(
        "return [...document.querySelectorAll('#lb-body tr.entry')].map(r => r.dataset.id)"
    )


def _values(drv: Any, col: str) -> list[float | None]:
    return drv.execute_script(
        "return [...document.querySelectorAll('#lb-body tr.entry td[data-col=\"' + arguments[0] + '\"]')]"
        ".map(td => td.dataset.value === undefined ? null : Number(td.dataset.value))",
        col,
    )


def _wait(drv: Any, cond: Any) -> None:
    from selenium.webdriver.support.ui import WebDriverWait

    WebDriverWait(drv, WAIT_S).until(cond)


# ============ no browser needed ============


def test_page_is_self_contained(site: dict[str, Any]) -> None:
    text = site["index"].read_text()
    assert not re.search(r"(src|href)\s*=\s*\"?(https?:)?//", text), "the page must not load anything remote"
    assert "http://" not in text and "https://" not in text
    block = text.split('<script type="application/json" id="leaderboard-data">', 1)[1].split("</script>", 1)[
        0
    ]
    assert "</" not in block and "<" not in block
    assert len(json.loads(block)["rows"]) == len(site["records"])


def test_figures_come_before_the_table(site17: dict[str, Any]) -> None:
    text = site17["index"].read_text()
    assert (
        0
        < text.index('<section id="figures">')
        < text.index('<ul class="legend">')
        < text.index('<table id="lb">')
    )


def test_embed_json_cannot_close_the_script() -> None:
    evil = {"key_params": "</script><script>alert(1)</script><!-- & -->"}
    text = embed_json(evil)
    assert "</" not in text and "<!--" not in text and "<" not in text
    assert json.loads(text) == evil


# ============ in the browser ============


def test_table_shows_every_entry(page: Any, site: dict[str, Any]) -> None:
    assert _ids(page) == [r["entry_id"] for r in site["records"]]
    assert (
        page.find_element("id", "count").text == f"{len(site['records'])} of {len(site['records'])} entries"
    )
    first = page.find_element("css selector", "#lb-body tr.entry")
    assert first.find_element("css selector", "td[data-col=family]").text == "intnacl"
    assert first.find_element("css selector", "td[data-col=clean]").get_attribute("data-value") == "0.935"


def test_header_click_sorts_numerically_and_toggles(page: Any, site: dict[str, Any]) -> None:
    recs = site["records"]
    # the JS keeps ties in display order and puts missing values last in both directions
    have = [r for r in recs if r["pgd_Linf_0.002_mean"] is not None]
    none = [r["entry_id"] for r in recs if r["pgd_Linf_0.002_mean"] is None]
    asc = [r["entry_id"] for r in sorted(have, key=lambda r: r["pgd_Linf_0.002_mean"])] + none
    desc = [r["entry_id"] for r in sorted(have, key=lambda r: -r["pgd_Linf_0.002_mean"])] + none
    header = page.find_element("css selector", "th[data-key=pgd]")
    header.click()
    assert _ids(page) == asc
    assert header.get_attribute("aria-sort") == "ascending"
    values = [v for v in _values(page, "pgd") if v is not None]
    assert values == sorted(values) and values[0] == pytest.approx(0.07)  # numeric, not "10.00" < "7.00"
    header.click()
    assert _ids(page) == desc
    assert header.get_attribute("aria-sort") == "descending"
    page.find_element("css selector", "th[data-key=n]").click()
    assert _values(page, "n") == sorted(_values(page, "n"))
    assert header.get_attribute("aria-sort") == "none"


def test_filter_box_and_setting_selector(page: Any, site: dict[str, Any]) -> None:
    from selenium.webdriver.support.ui import Select

    box = page.find_element("id", "filter")
    box.send_keys("intnacl")
    want = [r["entry_id"] for r in site["records"] if r["loss"] == "intnacl"]
    assert _ids(page) == want and len(want) == 4  # in-domain, transfer, two shifts
    box.clear()
    box.send_keys("zzz-no-such-recipe")
    assert _ids(page) == []
    box.clear()
    box.send_keys(" ")  # an input event with an empty filter: everything is back
    assert len(_ids(page)) == len(site["records"])
    Select(page.find_element("id", "setting")).select_by_value("transfer")
    assert _ids(page) == [r["entry_id"] for r in site["records"] if r["setting"] == "transfer"]
    box.send_keys("control")
    (only,) = _ids(page)
    assert only == next(r["entry_id"] for r in site["records"] if r["setting"] == "transfer" and r["control"])


def test_plots_load(page: Any) -> None:
    imgs = page.find_elements("css selector", "img.plot")
    srcs = [img.get_attribute("src") for img in imgs]
    assert len(imgs) == 3 and all(s.startswith("file://") for s in srcs)  # relative paths resolved on disk
    assert {s.rsplit("/", 1)[1] for s in srcs} == {
        "standard_vs_robust.png",
        "robust_vs_eps.png",
        "ablation_M.png",
    }
    _wait(page, lambda d: d.execute_script("return document.body.dataset.imagesLoaded") == "3")
    assert page.execute_script("return [...document.images].every(i => i.complete && i.naturalWidth > 0)")
    widths = page.execute_script("return [...document.querySelectorAll('img.plot')].map(i => i.naturalWidth)")
    assert widths == [1620, 1400, 1100]  # three tables' columns; in-domain and transfer panels; Fig. S2


def test_provenance_expands_and_collapses(page: Any, site: dict[str, Any]) -> None:
    rec = next(r for r in site["records"] if r["setting"] == "in-domain" and r["loss"] == "intnacl")
    row = page.find_element("css selector", f"tr.entry[data-id={rec['entry_id']}]")
    assert not page.find_elements("id", f"prov-{rec['entry_id']}")
    row.find_element("css selector", "button.prov-toggle").click()
    prov = page.find_element("id", f"prov-{rec['entry_id']}")
    text = prov.text
    raw = [json.loads(f.read_text()) for f in ROWS.glob("*.json")]
    src = next(r for r in raw if r["checkpoint_id"] == "convnet_small.intnacl_digits-0-4_s0")
    for needle in (src["checkpoint_id"], src["checkpoint_sha256"], src["suite_sha256"], src["device"]):
        assert needle in text
    assert "robustbench_nacl 0.1.0" in text and "200" in text
    assert "failed attack_beats_noise" in text
    # the provenance row follows its entry through a re-sort
    page.find_element("css selector", "th[data-key=clean]").click()
    after = page.execute_script(
        "const r = document.querySelector('tr.entry[data-id=\"' + arguments[0] + '\"]');"
        "return r.nextElementSibling && r.nextElementSibling.id",
        rec["entry_id"],
    )
    assert after == f"prov-{rec['entry_id']}"
    page.find_element("css selector", f"tr.entry[data-id={rec['entry_id']}] button.prov-toggle").click()
    assert not page.find_elements("id", f"prov-{rec['entry_id']}")


def _page_data(path: Path) -> dict[str, Any]:
    text = path.read_text()
    block = text.split('<script type="application/json" id="leaderboard-data">', 1)[1].split("</script>", 1)[
        0
    ]
    return json.loads(block)


def test_protocol_and_differs_columns_appear_only_when_needed(site: dict[str, Any], tmp_path: Path) -> None:
    keys = [c["key"] for c in _page_data(site["index"])["columns"]]
    assert "protocol" not in keys and "differs" not in keys  # one protocol, no ambiguous recipe
    rows = load_rows(ROWS)
    seed0 = [
        r for r in rows if r["loss"] == "simclr" and r["train_seed"] == 0 and r["setting"] == "in-domain"
    ]
    other = [ResultRow.from_json(stamp_ids({**r.to_json(), "n_examples": 50})) for r in seed0]
    data = _page_data(render_leaderboard([*rows, *other], tmp_path)["index.html"])
    assert [c["key"] for c in data["columns"]][5] == "protocol"
    notes = {r["cells"]["protocol"]["text"] for r in data["rows"] if r["setting"] == "in-domain"}
    assert notes == {"n_examples 50", "n_examples 200"}
    prov = data["rows"][0]["provenance"]
    assert len(prov["recipe_id"]) == 16 and len(prov["protocol_id"]) == 16


def test_seventeen_lines_fit_1400_pixels_below_the_figures(driver: Any, site17: dict[str, Any]) -> None:
    driver.get(site17["index"].as_uri())
    assert driver.execute_script("return window.outerWidth") == 1400
    geometry = driver.execute_script(
        "const d = document.documentElement, t = document.getElementById('lb').getBoundingClientRect();"
        "return {page: d.scrollWidth, view: d.clientWidth, right: t.right, table: t.top + scrollY,"
        " figures: document.getElementById('figures').getBoundingClientRect().top + scrollY,"
        " cols: document.querySelectorAll('#lb thead th').length}"
    )
    assert geometry["page"] <= geometry["view"] and geometry["right"] <= geometry["view"]  # no column cut off
    assert geometry["figures"] < geometry["table"]
    assert len(_ids(driver)) == len(site17["records"]) == 17 * 4  # in-domain, transfer, two shifts
    keys = [c["key"] for c in _page_data(site17["index"])["columns"]]
    assert geometry["cols"] == len(keys) and {"rank_metric", "delta", "clean", "fgsm", "pgd"} <= set(keys)


def test_intervals_and_the_comparison_show_under_their_values(driver: Any, site17: dict[str, Any]) -> None:
    driver.get(site17["index"].as_uri())
    rec = next(r for r in site17["records"] if r["setting"] == "in-domain" and r["loss"] == "random-init")
    row = driver.find_element("css selector", f"tr.entry[data-id={rec['entry_id']}]")
    clean = row.find_element("css selector", "td[data-col=clean]")
    lo, hi = rec["clean_lo"], rec["clean_hi"]
    assert clean.text.splitlines() == [f"{100 * rec['clean_mean']:.1f}", f"[{100 * lo:.1f}, {100 * hi:.1f}]"]
    delta = row.find_element("css selector", "td[data-col=delta]").text.splitlines()
    assert delta == [f"{100 * rec['vs_baseline_diff']:+.1f}", "p<0.001"]
    base = next(r for r in site17["records"] if r["setting"] == "in-domain" and r["is_baseline"])
    cell = driver.find_element("css selector", f"tr.entry[data-id={base['entry_id']}] td[data-col=delta]")
    assert cell.text == "baseline"


def test_the_label_free_section_is_a_static_escaped_table() -> None:
    from robustbench_nacl.report.html import render_page, static_section

    md = ["## Label-free", "", "Intro with `code` and <b>.", "", "### ε = 0.032", ""]
    md += ["| family | a <x> |", "|---|---|", "| simclr | 1.5 [0.0, 3.5] |", "| acl | 73.8 |", "", "After."]
    html = static_section(md)
    assert html.startswith("<h2>Label-free</h2>\n<p>Intro with <code>code</code> and &lt;b&gt;.</p>")
    assert "<h3>ε = 0.032</h3>" in html and "<p>After.</p>" in html
    assert '<thead><tr><th scope="col">family</th><th scope="col">a &lt;x&gt;</th></tr></thead>' in html
    assert html.count("<tr><td>") == 2 and "<tr><td>simclr</td><td>1.5 [0.0, 3.5]</td></tr>" in html
    page = render_page(title="t", lead="l", legend=[], columns=[], rows=[], images=[], extra=html)
    assert '<section id="label-free">' in page and page.index('id="lb"') < page.index('id="label-free"')
    bare = render_page(title="t", lead="l", legend=[], columns=[], rows=[], images=[])
    assert 'id="label-free"' not in bare
