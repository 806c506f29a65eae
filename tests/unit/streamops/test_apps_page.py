"""The apps page's pieces (no Airflow, no broker): the input-rate history a driver keeps, the
per-minute chart drawn from it, a row's rendering, backfill progress lines, the Data Docs'
CDN rewrite. The page itself is exercised in a real browser by test_operator_ui."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

from streamops import app_runtime, timestamps
from streamops.app_runtime import AppRuntime
from streamops.app_status import minute_rates
from streamops.apps_page import AppRow, render_page, sparkline
from streamops.quality import docs_assets
from streamops.reprocess import progress_line
from streamops.runtime_records import QueryProgress, RateLine

NOW = datetime(2026, 11, 24, 12, 0, 30, tzinfo=UTC)


def at(seconds_ago: float) -> str:
    return (NOW - timedelta(seconds=seconds_ago)).isoformat()


def test_the_chart_sums_every_query_per_minute_as_records_per_second():
    rates = [RateLine(at=at(10), query="a", input_rows=600), RateLine(at=at(20), query="b", input_rows=600),
             RateLine(at=at(90), query="a", input_rows=120), RateLine(at=at(3700), query="a", input_rows=9999),
             RateLine(at="not a time", query="a", input_rows=5)]
    per_minute = minute_rates(rates, NOW)
    assert len(per_minute) == 60
    assert per_minute[-1] == 20.0 and per_minute[-2] == 2.0 and sum(per_minute[:-2]) == 0  # an hour ago: out


def test_a_driver_keeps_an_hour_of_batch_rates_and_trims_the_rest(tmp_path, monkeypatch):
    runtime = AppRuntime(tmp_path / "checkpoint")
    old = (datetime.now(UTC) - timedelta(hours=2)).isoformat()
    runtime.write_progress("route", QueryProgress(query="a.route", batch_id=0, published_at=old, input_rows=7))
    runtime.write_progress("route", QueryProgress(query="a.route", batch_id=1, published_at=timestamps.now_iso(), input_rows=11))
    assert [e.input_rows for e in runtime.rates()] == [11]  # read: the last hour only
    line_bytes = len(runtime.rates_file.read_text().splitlines()[-1]) + 1
    # Past the limit the file is trimmed on write: to the last hour, then to half the limit (the
    # newest lines), so it is not rewritten again at every batch.
    monkeypatch.setattr(app_runtime, "RATE_HISTORY_BYTES", 2 * 2 * line_bytes + 20)
    for rows in (13, 17, 19):
        runtime.write_progress("route", QueryProgress(query="a.route", batch_id=rows, published_at=timestamps.now_iso(),
                                                      input_rows=rows))
    kept = [json.loads(line)["input_rows"] for line in runtime.rates_file.read_text().splitlines()]
    assert kept == [17, 19]
    runtime.rates_file.write_text(runtime.rates_file.read_text() + '{"at": "2026-11-2')  # a crash mid-line
    assert [e.input_rows for e in runtime.rates()] == [17, 19]


def test_a_row_that_needs_someone_is_red_with_its_evidence_and_links():
    rows = [
        AppRow("router", "crashed", True, "should be running but its driver is crashed (pid 42)", version="1.0.1",
               driver_host="host-a", dead_letters_total=3, restarts_total=2, has_driver_log=True,
               input_rate_per_minute=[0.0] * 59 + [12.5], runway_s=3_000.0, runway_where="ops partition 3, by retention.ms",
               recent_runs=[{"dag_id": "deploy_apps", "run_id": "manual__1+2", "at": "2026-11-24T11:00:00", "user": "ops",
                             "step": "deploy", "outcome": "done"}]),
        AppRow("counts", "stopped", False, "stopped by ops", spark_ui="http://host-b:4041"),
    ]
    page = render_page(rows, NOW, "/streamops/data-docs/index.html", "/streamops")
    assert "<h2 id='headline'>1 of 2 apps need attention: router</h2>" in page
    assert '<tr class="attention" data-app="router" data-state="crashed" data-restarts="2">' in page
    assert "should be running but its driver is crashed (pid 42)" in page
    assert 'href="/streamops/apps/router/driver-log"' in page and 'href="http://host-b:4041"' in page
    assert 'href="/dags/deploy_apps/runs/manual__1%2B2"' in page  # a run id is quoted into the link
    assert "peak 12.5/s, now 12.5/s" in page
    assert "<td class='runway'>50 min<div class='small'>ops partition 3, by retention.ms</div></td>" in page
    assert "<td class='runway'>-</td>" in page  # counts: nothing waits
    assert '<tr class="" data-app="counts" data-state="stopped"' in page
    assert "<script" not in page  # nothing external or scripted: the chart is inline SVG
    assert "<title>input rate over the last 60 minutes, peak 12.5 records/s, now 12.5 records/s</title>" in sparkline(
        [0.0] * 59 + [12.5])


def test_an_app_name_or_evidence_cannot_inject_markup():
    page = render_page([AppRow("<b>x</b>", "crashed", True, "<script>alert(1)</script>")], NOW, None, "/streamops")
    assert "<script>alert(1)" not in page and "&lt;script&gt;alert(1)&lt;/script&gt;" in page


def test_backfill_progress_says_done_planned_rate_and_time_left():
    assert progress_line("router", 0, 10_000, 20) == (
        "backfill of router: 0 of 10,000 records after 20 s (the driver is starting or working on its first batch)")
    assert progress_line("router", 2_500, 10_000, 10) == (
        "backfill of router: 2,500 of 10,000 records (25.0%), 250 records/s, about 30 s left")


def test_every_cdn_address_gx_writes_has_a_pinned_local_copy():
    page = "\n".join(f'<script src="{url}"></script>' for url in docs_assets.CDN_FILES)
    local = docs_assets.localise(page, "/assets")
    assert "https://" not in local
    # The longest address wins: .../vega@5 does not eat part of .../vega-lite@5 or .../vega-embed@6.
    assert '"/assets/vega-lite@5.23.0/build/vega-lite.min.js"' in local
    assert '"/assets/vega@5.33.1/build/vega.min.js"' in local
    assert docs_assets.missing() == []  # bin/setup fetched every file a page loads


def test_the_driver_log_served_is_one_of_the_apps_own_logs_whatever_driver_json_names(tmp_path):
    runtime = AppRuntime(tmp_path / "checkpoint")
    own = runtime.new_driver_log()
    secret = tmp_path / "airflow.cfg"
    secret.write_text("[core]\nfernet_key = not-for-viewers\n")
    runtime.dir.mkdir(parents=True, exist_ok=True)
    for named in (str(secret), str(runtime.logs_dir / ".." / ".." / "airflow.cfg"), str(own)):
        (runtime.dir / "driver.json").write_text(json.dumps({"driver_log": named}))
        assert runtime.driver_log() == own.resolve()


def test_past_drivers_are_linked_and_told_apart_running_stopped_failed_or_crashed(monkeypatch, tmp_path):
    from streamops import apps_page, spark_history
    from streamops.spark_history import PastDriver, driver_link, past_drivers

    listed = [{"id": f"app-{n}", "name": name, "attempts": [{"startTime": f"2026-12-04T0{n}:00:00.000GMT",
                                                             "endTime": "x", "completed": n != 4}]}
              for n, name in ((1, "streamops-router"), (2, "streamops-router"), (3, "streamops-router"),
                              (4, "streamops-router"), (5, "streamops-router-backfill"), (6, "someone-elses"))]

    class Answer:
        status_code = 200

        def raise_for_status(self):
            return None

        def json(self):
            return listed

    def get(url, params, timeout):  # the server's two lists: unfinished, then finished
        answer = Answer()
        answer.json = lambda: [a for a in listed if a["attempts"][0]["completed"] == (params["status"] == "completed")] + [
            "not an application", {"id": "<x>", "name": "streamops-router", "attempts": []}]
        return answer

    monkeypatch.setattr(spark_history.httpx, "get", get)
    drivers = past_drivers("http://history:18080")
    assert sorted(drivers) == ["router", "router-backfill"]  # the suite's drivers only; backfills apart
    assert [d.application_id for d in drivers["router"]] == ["app-4", "app-3", "app-2", "app-1"]  # newest first
    assert drivers["router"][0] == PastDriver("app-4", "2026-12-04T04:00:00.000GMT", None, False,
                                              "http://history:18080/history/app-4/jobs/")
    shown = apps_page._past_drivers(drivers["router"], "app-4", {"app-3": "failed", "app-2": "stopped"})
    assert [(d["application_id"], d["how"]) for d in shown] == [
        ("app-4", "running"), ("app-3", "failed"), ("app-2", "stopped"), ("app-1", "crashed")]
    page = render_page([AppRow("router", "running", False, "ok", past_drivers=shown)], NOW, None, "/streamops")
    assert ('<a class="history" data-how="crashed" data-app-id="app-1" href="http://history:18080/history/app-1/jobs/" '
            'target="_blank" rel="noopener">01:00 crashed</a>') in page
    # A driver is linked from evidence only when its event log is there.
    monkeypatch.setenv("STREAMOPS_SPARK_EVENT_LOG_DIR", str(tmp_path))
    monkeypatch.setenv("STREAMOPS_SPARK_HISTORY_URL", "http://history:18080/")
    (tmp_path / "eventlog_v2_app-7").mkdir()
    assert driver_link("app-7") == "http://history:18080/history/app-7/jobs/"
    assert driver_link("app-8") is None and driver_link(None) is None
