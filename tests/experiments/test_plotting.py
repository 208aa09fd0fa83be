"""Every figure's colors: a variant of a compared model is drawn in its family's color, apart by its line."""

from experiments.plotting import COLORS, color, family, line_style


def test_a_variant_takes_its_familys_color_and_a_line_of_its_own():
    """gated_deltanet_long is Gated DeltaNet's (not softmax's, matplotlib's first color); power's variants share
    power's color, each dashed or dotted where power is solid; a model outside COLORS has no fixed color."""
    assert (
        family("gated_deltanet_long") == "gated_deltanet" and color("gated_deltanet_long") == COLORS["gated_deltanet"]
    )
    assert family("swa_matched") == "swa_matched" and family("swa_4bit") == "swa"
    variants = ("power_rope", "power_const", "power_rope_const", "power_deg4")
    assert {color(v) for v in variants} == {COLORS["power"]}
    assert line_style("power") == {"color": COLORS["power"], "linestyle": "-"}
    assert all(line_style(v)["linestyle"] != "-" for v in variants)
    assert line_style("power_rope") == line_style("power_rope")  # fixed by the name, not by drawing order
    assert family("mystery") is None and color("mystery") is None
