"""KeyStore: remote servers' API keys in the OS keyring (the `keyring` package), never in the
settings file.

Where no keyring backend exists (keyring's fail or null backend: headless Linux, CI) or the
keyring refuses a write, a key is kept in memory for this session only, and `persistent` and
describe() say so, for the dialog to tell the user. Keys are cached in memory after the first
read, so the keyring (which may ask the desktop to unlock it) is asked at most once per server
and session.
"""

from __future__ import annotations

import logging

import keyring
from keyring.backends import fail, null
from keyring.errors import KeyringError

SERVICE = "ggstation"  # the keyring entry: service "ggstation", user name = the server's base URL

log = logging.getLogger(__name__)


class KeyStore:
    def __init__(self) -> None:
        self._cache: dict[str, str] = {}  # url -> key, "" for no key
        self._session_only: set[str] = set()  # urls whose key never reached the keyring

    @property
    def persistent(self) -> bool:
        """True when a real keyring backend is there to keep keys across sessions."""
        return not isinstance(keyring.get_keyring(), fail.Keyring | null.Keyring)

    def describe(self) -> str:
        if self.persistent:
            return (
                f"The key is saved in the system keyring ({type(keyring.get_keyring()).__name__})."
            )
        return "No system keyring is available: the key is kept until ggstation closes, then forgotten."

    def is_session_only(self, url: str) -> bool:
        return url in self._session_only

    def get(self, url: str) -> str:
        if url in self._cache:
            return self._cache[url]
        key = ""
        if self.persistent:
            try:
                key = keyring.get_password(SERVICE, url) or ""
            except KeyringError as e:  # locked, or the user refused: no key, and say why in the log
                log.warning("the keyring did not give the key of %s: %s", url, e)
        self._cache[url] = key
        return key

    def set(self, url: str, key: str) -> bool:
        """Keep `key` for `url` ("" deletes it); False when it is kept for this session only."""
        self._cache[url] = key
        if not key:
            self._forget(url)
            return True
        if self.persistent:
            try:
                keyring.set_password(SERVICE, url, key)
                self._session_only.discard(url)
                return True
            except KeyringError as e:
                log.warning("the keyring did not save the key of %s: %s", url, e)
        self._session_only.add(url)
        return False

    def delete(self, url: str) -> None:
        self._cache.pop(url, None)
        self._forget(url)

    def _forget(self, url: str) -> None:
        self._session_only.discard(url)
        if not self.persistent:
            return
        try:
            keyring.delete_password(SERVICE, url)
        except KeyringError:  # PasswordDeleteError: there was none
            pass
