"""Remote servers in the app: the add-server dialog, the models in the picker, a streamed reply
in the chat view, stop, history, errors in words, the dashboard's remote slots, and the API key
in the keyring (an in-memory test backend, and keyring's fail backend: session only).

The servers are local: tests/openai_server.py (plain OpenAI, key checked, faults on demand)
and a real `ggstation serve` process with a tiny generated model.
"""

from __future__ import annotations

from pathlib import Path

import keyring
import pytest
from keyring.backend import KeyringBackend
from keyring.backends import fail
from keyring.errors import PasswordDeleteError

import openai_server
from app.key_store import SERVICE
from app.widgets.endpoint_dialog import EndpointDialog

from .conftest import send

KEY = "sk-test-0123456789"


class MemoryKeyring(KeyringBackend):
    """A keyring in a dict, standing in for the OS keyring."""

    priority = 1  # type: ignore[assignment]

    def __init__(self) -> None:
        super().__init__()
        self.entries: dict[tuple[str, str], str] = {}

    def get_password(self, service: str, username: str) -> str | None:
        return self.entries.get((service, username))

    def set_password(self, service: str, username: str, password: str) -> None:
        self.entries[(service, username)] = password

    def delete_password(self, service: str, username: str) -> None:
        if self.entries.pop((service, username), None) is None:
            raise PasswordDeleteError("no such entry")


@pytest.fixture
def memory_keyring():
    before = keyring.get_keyring()
    backend = MemoryKeyring()
    keyring.set_keyring(backend)
    yield backend
    keyring.set_keyring(before)


@pytest.fixture
def no_keyring():
    before = keyring.get_keyring()
    keyring.set_keyring(fail.Keyring())
    yield
    keyring.set_keyring(before)


@pytest.fixture
def oai():
    server = openai_server.start(api_key=KEY, models=("alpha", "beta"))
    yield server
    server.stop()


def fill_dialog(
    qtbot, open_dialog, url: str, key: str = "", name: str = "", cancel: bool = False
) -> EndpointDialog:
    """Open the add/edit dialog with `open_dialog()`, type into it and press Save; a refused
    URL keeps it open (or `cancel`): then it is closed with Cancel. Returns the dialog."""
    open_dialog()
    dialog = window_of(open_dialog).picker.remote.dialog
    assert isinstance(dialog, EndpointDialog) and dialog.isVisible()
    dialog.name_edit.setText(name)
    dialog.url_edit.setText(url)
    dialog.key_edit.setText(key)
    dialog.accept()
    if cancel or dialog.isVisible():
        dialog.reject()
    return dialog


def window_of(bound_method):
    return bound_method.__self__.window()


def add_server(window, qtbot, url: str, key: str = "", name: str = "") -> None:
    panel = window.picker.remote
    fill_dialog(qtbot, panel.add_endpoint, url, key, name)
    qtbot.waitUntil(
        lambda: (
            panel.current_endpoint() is not None
            and panel.current_endpoint().url == url
            and (url in panel.servers or "error" == panel.status.objectName())
        ),
        timeout=10000,
    )


def choose(window, qtbot, model: str) -> None:
    panel = window.picker.remote
    row = panel.models.ids().index(model)
    panel.model_view.setCurrentIndex(panel.models.index(row))
    panel.chat_button.click()
    assert window.ctx.chat_llm is not None and window.ctx.chat_llm.name == model


# -- add, list, key ---------------------------------------------------------------------------


def test_remote_add_server_lists_its_models_and_keeps_the_key_in_the_keyring(
    window, qtbot, oai, memory_keyring
):
    panel = window.picker.remote
    dialog = fill_dialog(qtbot, panel.add_endpoint, oai.url + "/v1/", KEY, "Test box")
    assert "system keyring (MemoryKeyring)" in dialog.key_note.text()
    qtbot.waitUntil(lambda: panel.models.ids() == ["alpha", "beta"], timeout=10000)
    assert panel.endpoints.endpoints()[0].url == oai.url  # the /v1 the user typed is not kept
    assert "OpenAI-compatible · 2 models" in panel.endpoints.index(0).data()
    assert "no slots or metrics" in panel.status.text()
    assert memory_keyring.entries == {(SERVICE, oai.url): KEY}
    # the settings hold the server, never its key
    assert window.ctx.settings.remote_endpoints == [{"name": "Test box", "url": oai.url}]
    settings_file = Path(window.ctx.qsettings.fileName())
    assert oai.url in settings_file.read_text() and KEY not in settings_file.read_text()


def test_remote_servers_and_keys_survive_a_restart(
    make_window, qtbot, oai, memory_keyring, data_dir
):
    w = make_window()
    add_server(w, qtbot, oai.url, KEY, "Box")
    w.close()
    w2 = make_window(directory=data_dir)
    panel = w2.picker.remote
    assert [e.url for e in panel.endpoints.endpoints()] == [oai.url]
    qtbot.waitUntil(
        lambda: panel.models.ids() == ["alpha", "beta"], timeout=10000
    )  # the key came back


def test_remote_without_keyring_keeps_the_key_for_the_session(window, qtbot, oai, no_keyring):
    panel = window.picker.remote
    dialog = fill_dialog(qtbot, panel.add_endpoint, oai.url, KEY)
    assert "No system keyring" in dialog.key_note.text()
    qtbot.waitUntil(lambda: panel.models.ids() == ["alpha", "beta"], timeout=10000)
    assert "session only" in panel.status.text()
    assert KEY not in Path(window.ctx.qsettings.fileName()).read_text()


# -- errors in words ----------------------------------------------------------------------------


def test_remote_dialog_refuses_an_invalid_url(window, qtbot):
    panel = window.picker.remote
    dialog = fill_dialog(qtbot, panel.add_endpoint, "ftp://nowhere", cancel=True)
    assert (
        dialog.error_label.isVisibleTo(dialog) and "not an http(s) URL" in dialog.error_label.text()
    )
    assert panel.endpoints.rowCount() == 0


def test_remote_wrong_key_and_non_openai_server_are_explained(window, qtbot, oai, memory_keyring):
    panel = window.picker.remote
    add_server(window, qtbot, oai.url, "wrong-key")
    qtbot.waitUntil(lambda: "refused the API key" in panel.status.text(), timeout=10000)
    assert panel.models.rowCount() == 0 and "not connected" in panel.endpoints.index(0).data()
    oai.not_json = True
    fill_dialog(qtbot, panel.edit_endpoint, oai.url, KEY)
    qtbot.waitUntil(
        lambda: "did not answer like an OpenAI-compatible server" in panel.status.text(),
        timeout=10000,
    )


# -- chat --------------------------------------------------------------------------------------


def test_remote_chat_streams_into_the_chat_view_and_is_remembered(
    window, qtbot, oai, memory_keyring
):
    add_server(window, qtbot, oai.url, KEY, "Box")
    choose(window, qtbot, "beta")
    assert window.tabs.currentIndex() == 0 and "beta @ Box" in window.llm_label.text()
    window.ctx.settings.sampling = window.ctx.settings.sampling.__class__(
        temperature=0.25, top_p=0.5, seed=9, max_tokens=77
    )
    texts: list[str] = []
    window.chat.chat_model.dataChanged.connect(
        lambda *_: texts.append(window.chat.chat_model.message(1).content)
    )
    send(window, qtbot, "Hello remote")
    reply = window.chat.chat_model.message(1)
    assert reply.content == openai_server.REPLY
    assert 1 < len(texts) and texts[0] != reply.content  # it grew in steps: streamed, not at once
    body = oai.requests[-1]
    assert body["model"] == "beta" and body["messages"][-1] == {
        "role": "user",
        "content": "Hello remote",
    }
    assert (body["temperature"], body["top_p"], body["seed"], body["max_tokens"]) == (
        0.25,
        0.5,
        9,
        77,
    )
    assert "top_k" not in body  # a plain OpenAI server gets OpenAI's fields only
    assert (
        not window.sampling.inputs["top_k"].isEnabled()
        and "Not sent" in window.sampling.inputs["min_p"].toolTip()
    )
    assert window.sampling.inputs["temperature"].isEnabled()
    replay = reply.stats["replay"]
    assert (replay["endpoint"], replay["model"]) == (oai.url, "beta")
    assert reply.stats["n_generated"] == len(openai_server.REPLY.split(" "))
    # history: stored like a local chat, and opening it again brings the remote model back
    conversation_id = window.chat.conversation_id
    stored = window.ctx.store.messages(conversation_id)
    assert [m.content for m in stored] == ["Hello remote", openai_server.REPLY]
    window.chat.new_conversation()
    window.ctx.clear_remote()
    assert window.ctx.chat_llm is None
    window.chat.open_conversation(conversation_id)
    qtbot.waitUntil(
        lambda: window.ctx.chat_llm is not None and window.ctx.chat_llm.name == "beta",
        timeout=10000,
    )
    assert window.ctx.remote_endpoint is not None and window.ctx.remote_endpoint.url == oai.url
    # the server gone: opening the conversation says so, and nothing crashes
    window.chat.new_conversation()
    window.ctx.clear_remote()
    assert window.sampling.inputs["top_k"].isEnabled()  # back to no remote: every field applies
    oai.stop()
    window.chat.open_conversation(conversation_id)
    qtbot.waitUntil(lambda: "Cannot reach" in window.status.currentMessage(), timeout=10000)
    assert window.ctx.chat_llm is None


def test_remote_editing_the_chosen_server_chooses_its_model_again_with_the_new_key(
    window, qtbot, oai, memory_keyring
):
    add_server(window, qtbot, oai.url, "wrong-key", "Box")
    qtbot.waitUntil(
        lambda: "refused the API key" in window.picker.remote.status.text(), timeout=10000
    )
    fill_dialog(qtbot, window.picker.remote.edit_endpoint, oai.url, KEY, "Box")
    qtbot.waitUntil(lambda: window.picker.remote.models.ids() == ["alpha", "beta"], timeout=10000)
    choose(window, qtbot, "alpha")
    oai.api_key = "rotated"
    fill_dialog(qtbot, window.picker.remote.edit_endpoint, oai.url, "rotated", "Box 2")
    qtbot.waitUntil(
        lambda: (
            window.ctx.remote_endpoint is not None and window.ctx.remote_endpoint.name == "Box 2"
        ),
        timeout=10000,
    )
    assert memory_keyring.entries[(SERVICE, oai.url)] == "rotated"
    send(window, qtbot, "hi")
    assert window.chat.chat_model.message(1).content == openai_server.REPLY  # the new key was used


def test_remote_stop_closes_the_stream_and_the_server_sees_it(window, qtbot, oai, memory_keyring):
    add_server(window, qtbot, oai.url, KEY)
    choose(window, qtbot, "alpha")
    oai.endless = True
    window.chat_pane.input.setPlainText("go on forever")
    window.chat_pane.submit()
    qtbot.waitUntil(lambda: len(window.chat.chat_model.message(1).content) > 20, timeout=10000)
    with qtbot.waitSignal(
        window.chat.busy_changed, timeout=5000, check_params_cb=lambda busy: not busy
    ):
        window.chat_pane.stop_button.click()
    assert oai.cancelled.wait(5), "the server's stream was not closed"
    assert window.chat.chat_model.message(1).stats["finish_reason"] == "stopped"


def test_remote_model_gone_and_dropped_connection_are_errors_not_crashes(
    window, qtbot, oai, memory_keyring
):
    add_server(window, qtbot, oai.url, KEY)
    choose(window, qtbot, "beta")
    oai.models = ("alpha",)  # the server no longer has it
    with qtbot.waitSignal(window.chat.failed, timeout=10000) as failed:
        window.chat_pane.input.setPlainText("still there?")
        window.chat_pane.submit()
    assert "does not exist" in failed.args[0]
    qtbot.waitUntil(lambda: not window.chat.busy(), timeout=5000)
    oai.drop_after = 3
    choose(window, qtbot, "alpha")
    with qtbot.waitSignal(window.chat.failed, timeout=10000) as failed:
        window.chat_pane.input.setPlainText("and now?")
        window.chat_pane.submit()
    assert "ended in the middle of the reply" in failed.args[0]
    qtbot.waitUntil(lambda: not window.chat.busy(), timeout=5000)
    assert window.chat.chat_model.message(
        window.chat.chat_model.rowCount() - 1
    ).content  # what came is kept


# -- a real ggstation server: slots and throughput in the dashboard ------------------------------------


def test_remote_ggstation_slots_and_throughput_in_the_dashboard(
    window, qtbot, ggstation, memory_keyring
):
    add_server(window, qtbot, ggstation.url, "sekret", "ggstation box")
    panel, dash = window.picker.remote, window.dashboard
    assert "ggstation server · 2 slots · dashboard from /slots and /metrics" in panel.status.text()
    assert panel.models.ids() == ["tiny"]
    choose(window, qtbot, "tiny")
    assert window.sampling.inputs["top_k"].isEnabled()  # ggstation takes llama-server's fields
    qtbot.waitUntil(lambda: dash.slot_model.rowCount() == 2, timeout=10000)
    assert dash.side_tabs.tabText(0) == "Slots on ggstation box"
    assert dash.slot_model.index(0, 0).data() in ("0 · idle", "0 · busy")
    window.ctx.settings.sampling = window.ctx.settings.sampling.__class__(max_tokens=24, seed=3)
    send(window, qtbot, "Hello", timeout=60000)
    reply = window.chat.chat_model.message(1)
    assert reply.stats["finish_reason"] in ("stop", "length") and reply.stats["n_prompt"] > 0
    assert reply.stats["replay"]["n_ctx"] == 1024  # the server said its context size
    series = dash.timeline.series["server tokens/s"].points
    qtbot.waitUntil(lambda: any(v > 0 for _t, v in series), timeout=10000)
    qtbot.waitUntil(lambda: "tokens/s generated" in dash.remote_status.text(), timeout=5000)
    # back to local: the slot table returns to the engine's own slots
    window.ctx.clear_remote()
    assert dash.side_tabs.tabText(0) == "KV cache per slot" and dash.slot_model.rowCount() == 0
