"""The parts of the remote-server feature on their own: the item models (qtmodeltester), the key
store when the keyring fails, the settings entries, the poller's rate and its errors, and the
mapping of a remote stream to ReplySteps."""

from __future__ import annotations

import threading

import keyring
import pytest
from keyring.backend import KeyringBackend
from keyring.errors import KeyringError, PasswordSetError

from app.dto import (
    EndpointInfo,
    RemoteLoad,
    RemoteModelInfo,
    RemoteServerState,
    RemoteSlotRow,
    SamplingSettings,
)
from app.engine_api import RemoteApi
from app.item_models.endpoint_list_model import ENDPOINT_ROLE, EndpointListModel
from app.item_models.remote_model_list_model import MODEL_ID_ROLE, RemoteModelListModel
from app.item_models.slot_table_model import SlotTableModel
from app.key_store import KeyStore
from app.remote_adapter import RemoteChat
from app.settings import AppSettings
from app.workers import RemotePoller


class LockedKeyring(KeyringBackend):
    """A keyring that exists but refuses every write and read (locked, or the user said no)."""

    priority = 1  # type: ignore[assignment]

    def get_password(self, service: str, username: str) -> str | None:
        raise KeyringError("locked")

    def set_password(self, service: str, username: str, password: str) -> None:
        raise PasswordSetError("locked")

    def delete_password(self, service: str, username: str) -> None:
        raise KeyringError("locked")


@pytest.fixture
def locked_keyring():
    before = keyring.get_keyring()
    keyring.set_keyring(LockedKeyring())
    yield
    keyring.set_keyring(before)


def test_key_store_falls_back_to_the_session_when_the_keyring_refuses(locked_keyring):
    keys = KeyStore()
    assert keys.persistent and "system keyring" in keys.describe()
    assert keys.set("http://a", "k1") is False and keys.is_session_only("http://a")
    assert keys.get("http://a") == "k1"  # kept for the session
    assert KeyStore().get("http://a") == ""  # a new session: gone, and no exception
    keys.delete("http://a")
    assert keys.get("http://a") == "" and not keys.is_session_only("http://a")


def test_endpoint_list_model(qtmodeltester):
    model = EndpointListModel()
    model.set_endpoints([EndpointInfo("A", "http://a"), EndpointInfo("", "http://b")])
    assert (
        model.index(1).data() == "http://b" and model.index(0).data(ENDPOINT_ROLE).url == "http://a"
    )
    model.set_status("http://a", "ggstation · 1 model")
    assert model.index(0).data() == "A\nggstation · 1 model"
    assert model.add_or_replace(EndpointInfo("C", "http://c"), old_url="http://b") == 1
    assert [e.url for e in model.endpoints()] == ["http://a", "http://c"]
    model.add_or_replace(EndpointInfo("D", "http://d"))
    model.remove(0)
    assert model.row_of("http://d") == 1
    qtmodeltester.check(model, force_py=True)


def test_remote_model_list_model(qtmodeltester):
    model = RemoteModelListModel()
    model.set_models((RemoteModelInfo("m1", 4096), RemoteModelInfo("org/m2")))
    assert (
        model.index(0).data() == "m1   ·   context 4,096"
        and model.index(1).data(MODEL_ID_ROLE) == "org/m2"
    )
    qtmodeltester.check(model, force_py=True)


def test_slot_table_model_shows_remote_slots_then_local_again(qtmodeltester):
    from app.dto import MemoryFigures

    model = SlotTableModel()
    model.set_remote_slots((RemoteSlotRow(0, 1000, True, 250), RemoteSlotRow(1, 1000, False, 0)))
    assert [model.index(0, c).data() for c in range(3)] == ["0 · busy", "250 tokens", "25.0 %"]
    model.set_figures(
        MemoryFigures(kv_bytes=2000, kv_per_seq_used=(500, 0, 0))
    )  # ignored meanwhile
    assert model.rowCount() == 2
    qtmodeltester.check(model, force_py=True)
    model.clear_remote()
    model.set_figures(MemoryFigures(kv_bytes=2000, kv_per_seq_used=(500, 0, 0)))
    assert model.rowCount() == 3 and model.index(0, 1).data() != "250 tokens"


def test_settings_keep_endpoints_without_keys_and_skip_bad_entries():
    s = AppSettings()
    s.set_endpoints([EndpointInfo("A", "http://a")])
    assert s.remote_endpoints == [{"name": "A", "url": "http://a"}]
    s.remote_endpoints = [{"name": "A", "url": "http://a"}, {"name": "no url"}, "junk", {"url": 3}]
    assert s.endpoints() == [EndpointInfo("A", "http://a")]


class ScriptedRemote(RemoteApi):
    """poll() answers from a list: a RemoteLoad, or an exception to raise."""

    def __init__(self, answers: list):
        self.answers = answers

    def normalize_url(self, text: str) -> str:
        return text

    def connect(self, endpoint: EndpointInfo, api_key: str) -> RemoteServerState:
        raise NotImplementedError

    def open_chat(self, endpoint, api_key, model, server):
        raise NotImplementedError

    def poll(self, endpoint: EndpointInfo, api_key: str, server: RemoteServerState) -> RemoteLoad:
        answer = self.answers.pop(0) if self.answers else RemoteLoad(endpoint.url)
        if isinstance(answer, Exception):
            raise answer
        return answer


def test_remote_poller_reports_rate_and_errors_and_keeps_polling(qtbot):
    from engine.errors import RemoteError

    url = "http://x"
    remote = ScriptedRemote(
        [
            RemoteLoad(url, tokens_predicted_total=100.0),
            RemoteLoad(url, tokens_predicted_total=160.0),
            RemoteError("Cannot reach http://x", RemoteError.UNREACHABLE),
            RemoteLoad(url, tokens_predicted_total=200.0),
        ]
    )
    poller = RemotePoller(
        remote, EndpointInfo("", url), "", RemoteServerState(url, "ggstation"), interval_s=0.01
    )
    loads: list[RemoteLoad] = []
    poller.polled.connect(loads.append)
    t = threading.Thread(target=poller.run)
    t.start()
    qtbot.waitUntil(lambda: len(loads) >= 4, timeout=5000)
    poller.cancel()
    t.join(5)
    assert loads[0].tokens_per_s is None  # one sample: no rate yet
    assert loads[1].tokens_per_s is not None and loads[1].tokens_per_s > 0
    assert "Cannot reach" in loads[2].error
    assert loads[3].tokens_per_s is None  # after an error the rate starts again


def test_remote_chat_context_and_sampling_fields():
    server = RemoteServerState(
        "http://x", "openai", (RemoteModelInfo("m", 8192), RemoteModelInfo("n")), n_ctx=0
    )
    assert RemoteChat(EndpointInfo("", "http://x"), "", "m", server).n_ctx_seq == 8192
    chat = RemoteChat(EndpointInfo("", "http://x"), "", "n", server)
    assert chat.n_ctx_seq == 0 and chat.endpoint == "http://x"  # not known: the worker does not cut
    assert chat.count_tokens([{"role": "user", "content": "x" * 300}]) >= 75
    stream = chat.generate([{"role": "user", "content": "hi"}], SamplingSettings(seed=-1, top_k=3))
    body = stream._stream.body
    assert "seed" not in body and "top_k" not in body and body["model"] == "n"
