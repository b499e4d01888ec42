"""The docs' figures are the results' (issue 57): the blocks `bench/figures.py` writes from the results
files are current, and every other figure on the performance page is one a results file holds."""

from bench import figures


def test_the_docs_figures_are_the_results() -> None:
    assert figures.check() == []


def test_a_figure_no_result_holds_is_named(tmp_path) -> None:  # type: ignore[no-untyped-def]
    page = tmp_path / "page.md"
    page.write_text("Decode 98765.4321 tok/s, `--iters 200` and 7 layers; <!-- figures: dvc-build -->\n9.87\n<!-- /figures -->\n")
    assert figures.untraced(page) == ["98765.4321"]
