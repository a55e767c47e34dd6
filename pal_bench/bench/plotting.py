"""matplotlib for files only: one place that selects the Agg backend (no display needed)."""


def pyplot():
    """``matplotlib.pyplot`` on the Agg backend, imported on first use (drawing modules call this inside
    their draw functions, so importing them does not import matplotlib)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt
