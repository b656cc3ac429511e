"""The one-shot report reads well: numbers rounded for people in its text and JSON, every digit kept in its data."""

from __future__ import annotations

import json

from prunereg import OneShotReport
from prunereg._oneshot.report import LayerReport, Timings

NOISY = 0.7 + 0.08  # 0.7799999999999999, as OWL computes it


def owl_report() -> OneShotReport:
    report = OneShotReport(method="wanda", sparsity=0.7, pattern=None, allocation="owl", n_tokens=512, permanent=True)
    report.layers = [LayerReport("model.layers.0.mlp.up_proj", (4, 8), NOISY, NOISY)]
    report.block_sparsities = [NOISY, 0.1 * 3 + 0.32]
    report.outlier_ratios = [0.1 * 3, 0.2]
    report.timings = Timings(capture=0.123456, forward=1.98765, total=2.3456789)
    return report


def test_json_rounds_shares_to_six_decimals_and_seconds_to_three():
    report = owl_report()
    text = json.dumps(report.as_dict())
    assert "0.7799999999999999" not in text and "0.30000000000000004" not in text
    data = json.loads(text)
    assert data["block_sparsities"] == [0.78, 0.62] and data["outlier_ratios"] == [0.3, 0.2]
    assert data["layers"][0]["target"] == 0.78 and data["overall_sparsity"] == 0.78
    assert data["timings"]["total"] == 2.346 and data["timings"]["capture"] == 0.123
    assert report.block_sparsities[0] == NOISY  # the data keeps every digit


def test_timings_and_the_report_print_as_sentences_not_dataclasses():
    report = owl_report()
    assert str(report.timings) == (
        "2.3 s: capture 0.1, forwards 2.0, statistics 0.0, pruning 0.0, outlier pass 0.0, loading 0.0"
    )
    text = str(report)
    assert "Timings(" not in text and "0.7799999999999999" not in text
    assert "block targets: 78.0%, 62.0%" in text and "time 2.3 s: capture 0.1" in text
