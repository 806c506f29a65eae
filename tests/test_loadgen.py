"""The load generator produces what it reports, with sequence numbers and the asked-for faults."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

from streamops.kafka_records import read_all
from streamops.loadgen import LoadSpec, run


def test_loadgen_produces_sequence_numbered_records_with_malformed_and_late_ones(broker, app_catalog):
    spec = app_catalog.app("oplog-router")
    start = datetime(2026, 3, 1, tzinfo=UTC)
    report = run(
        spec,
        LoadSpec(count=2000, keys=20, malformed=0.05, late=0.1, late_by=timedelta(minutes=5), start_seq=100,
                 start_time=start, seed=11),
        broker.client_config,
    )
    records = read_all(broker.client_config, spec.inputs["operations"])
    assert report.produced == len(records) == 2000
    good, bad = [], 0
    for record in records:
        try:
            event = json.loads(record.value)
        except ValueError:
            bad += 1
            continue
        ok = (isinstance(event.get("seq"), int) and {"user_id", "op_type"} <= event.keys()
              and event.get("event_time", "").endswith("Z"))
        if ok:
            good.append(event)
            assert record.key_text == event["user_id"]
        else:
            bad += 1
    assert bad == report.malformed and 60 <= bad <= 140  # 5 % of 2000, give or take
    assert {e["user_id"] for e in good} <= {f"user-{i}" for i in range(20)}
    seqs = sorted(e["seq"] for e in good)
    assert seqs[0] >= 100 and seqs[-1] <= 2099 and len(set(seqs)) == len(seqs)
    times = [datetime.fromisoformat(e["event_time"].replace("Z", "+00:00")) for e in good]
    late = sum(1 for e, t in zip(good, times, strict=True)
               if t < start + timedelta(milliseconds=e["seq"] - 100) - timedelta(minutes=4))
    assert 140 <= late <= 260 and report.late >= late  # ~10 % five minutes behind their slot
    assert "produced 2000 records (seq 100..2099;" in report.summary()
