"""The oldest torch commgrid.torch runs on, checked once at import."""

MIN_TORCH = (2, 6)


def _release(version):
    """(major, minor) of a torch version string such as "2.15.0+cu132" or "1.13.1"."""
    parts = []
    for piece in version.split("+")[0].split(".")[:2]:
        digits = "".join(c for c in piece if c.isdigit()) or "0"
        parts.append(int(digits))
    return tuple(parts + [0] * (2 - len(parts)))


def check_torch(version, feature="commgrid.torch", needed=MIN_TORCH):
    """ImportError naming the version needed when ``version`` is older than ``needed``."""
    if _release(version) < needed:
        raise ImportError(f"{feature} needs torch >= {needed[0]}.{needed[1]}, but this is torch "
                          f"{version}")
