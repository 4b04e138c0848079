"""What every call to the Hugging Face Hub shares: where the Hub and its cache are (read from
the environment at each call, as huggingface_hub reads it), how long one request may wait, and
huggingface_hub's exceptions as one-line HubErrors.

Below the Hub's client (client.py: listings, resolution, downloads) and the fit from a file's
header (fit.py), which both make requests.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path

from ..errors import HubError

DEFAULT_ENDPOINT = "https://huggingface.co"
TOKEN_HELP = "a token is needed: pass -hft TOKEN, set HF_TOKEN, or run `hf auth login`"
TIMEOUT_S = 30.0  # connect/read timeout of one request


def endpoint() -> str:
    """HF_ENDPOINT or the public Hub, read now (not when huggingface_hub was imported)."""
    return (os.environ.get("HF_ENDPOINT") or DEFAULT_ENDPOINT).rstrip("/")


def cache_dir() -> Path:
    """huggingface_hub's cache directory, by its own rules, read now."""
    env = os.environ.get("HF_HUB_CACHE") or os.environ.get("HUGGINGFACE_HUB_CACHE")
    if env:
        return Path(os.path.expandvars(env)).expanduser()
    home = os.environ.get("HF_HOME") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache"),
        "huggingface",
    )
    return Path(os.path.expandvars(home)).expanduser() / "hub"


def offline() -> bool:
    return os.environ.get("HF_HUB_OFFLINE", "").strip().upper() in ("1", "ON", "YES", "TRUE")


def transport_errors() -> tuple[type[BaseException], ...]:
    """The HTTP client's connection/timeout errors (httpx2 under huggingface_hub 2.x)."""
    out: list[type[BaseException]] = [ConnectionError, TimeoutError]
    for mod in ("httpx2", "httpx"):
        with contextlib.suppress(ImportError):
            out.append(__import__(mod).TransportError)
    return tuple(out)


@contextlib.contextmanager
def hub_errors(what: str, token: str | None = None, network: bool = True) -> Iterator[None]:
    """huggingface_hub's exceptions, and with `network` the connection's, as one-line HubErrors."""
    from huggingface_hub import errors as hf

    try:
        yield
    except HubError:
        raise
    except hf.GatedRepoError:
        raise HubError(
            f"{what}: gated repository; accept its terms on the Hub, then {TOKEN_HELP}"
            + (" (the token given has no access)" if token else ""),
            HubError.AUTH,
        ) from None
    except hf.RepositoryNotFoundError as e:
        if e.response is not None and e.response.status_code in (401, 403):
            raise HubError(f"{what}: not found, or private: {TOKEN_HELP}", HubError.AUTH) from None
        raise HubError(f"{what}: no such repository on {endpoint()}", HubError.NOT_FOUND) from None
    except hf.RevisionNotFoundError:
        raise HubError(f"{what}: no such revision", HubError.NOT_FOUND) from None
    except hf.RemoteEntryNotFoundError:
        raise HubError(f"{what}: no such file in the repository", HubError.NOT_FOUND) from None
    except (hf.OfflineModeIsEnabled, hf.LocalEntryNotFoundError):
        raise HubError(
            f"{what}: offline (HF_HUB_OFFLINE is set) and not in the cache {cache_dir()}",
            HubError.OFFLINE,
        ) from None
    except hf.HFValidationError as e:  # a repo id or revision huggingface_hub refuses to send
        raise HubError(f"{what}: {str(e).strip().splitlines()[0]}", HubError.NOT_FOUND) from None
    except hf.HfHubHTTPError as e:
        status = e.response.status_code if e.response is not None else 0
        if status in (401, 403):
            raise HubError(
                f"{what}: access refused ({status}): {TOKEN_HELP}", HubError.AUTH
            ) from None
        raise HubError(
            f"{what}: the Hub answered {status or 'an error'}: {str(e).strip().splitlines()[0]}",
            HubError.HUB,
        ) from None
    except transport_errors() as e:
        if not network:
            raise
        raise unreachable(what, e) from None
    except (ValueError, TypeError, KeyError) as e:  # JSON that is not a listing
        raise HubError(
            f"{what}: the Hub's answer could not be read ({type(e).__name__}: {e})", HubError.HUB
        ) from None


def unreachable(what: str, e: BaseException) -> HubError:
    return HubError(
        f"{what}: cannot reach {endpoint()} ({type(e).__name__}: {e}); "
        "models already in the cache still work",
        HubError.OFFLINE,
    )
