"""Every Qt item model passes pytest-qt's qtmodeltester (QAbstractItemModelTester)."""

from __future__ import annotations

from app.dto import LlmFileInfo, MemoryFigures, StarterModel, TensorRow
from app.item_models.chat_list_model import STREAMING_ROLE, ChatListModel
from app.item_models.conversation_list_model import ConversationListModel
from app.item_models.layer_table_model import LayerTableModel
from app.item_models.llm_file_table_model import LlmFileTableModel
from app.item_models.slot_table_model import SlotTableModel
from app.item_models.starter_list_model import StarterListModel
from app.storage import Conversation, Message


def test_chat_list_model_passes_modeltester_while_streaming(qtmodeltester):
    model = ChatListModel()
    model.set_messages(
        [Message("user", "hi", 1), Message("assistant", "hello", 2, {"n_generated": 1})]
    )
    qtmodeltester.check(model, force_py=True)
    model.append(Message("user", "more", 3))
    model.append(Message("assistant", "", 4), streaming=True)
    for word in ("one ", "two ", "three"):
        model.append_delta(word)
    assert model.message(3).content == "one two three"
    assert model.index(3).data(STREAMING_ROLE) is True
    model.finish_streaming({"n_generated": 3})
    assert model.index(3).data(STREAMING_ROLE) is False
    model.truncate(2)
    assert model.rowCount() == 2
    qtmodeltester.check(model, force_py=True)


def test_chat_list_model_append_delta_updates_only_last_row(qtbot):
    model = ChatListModel()
    model.set_messages([Message("user", "a", 1)])
    model.append(Message("assistant", "", 2), streaming=True)
    with qtbot.waitSignal(model.dataChanged) as blocker:
        model.append_delta("x")
    top, bottom = blocker.args[0], blocker.args[1]
    assert top.row() == bottom.row() == 1


def test_conversation_list_model_rename_emits_title_edited(qtmodeltester, qtbot):
    model = ConversationListModel()
    model.set_conversations([Conversation(1, "first", 1.0), Conversation(2, "second", 2.0)])
    qtmodeltester.check(model, force_py=True)
    with qtbot.waitSignal(model.title_edited) as blocker:
        assert model.setData(model.index(1), "renamed")
    assert blocker.args == [2, "renamed"]
    assert not model.setData(model.index(0), "   ")


def test_llm_file_table_model_lists_unusable_files_with_reason(qtmodeltester):
    model = LlmFileTableModel()
    model.add_or_update(
        LlmFileInfo(
            "/a.gguf", "a", "llama", 135_000_000, {"Q4_1": 10, "F32": 2}, 90 << 20, 8192, True
        )
    )
    model.add_or_update(LlmFileInfo("/b.gguf", "b", error="unsupported quant type IQ2_XS"))
    model.add_or_update(LlmFileInfo("/a.gguf", "a2", "llama"))  # update in place
    assert model.rowCount() == 2
    assert "IQ2_XS" in model.index(1, 7).data()
    qtmodeltester.check(model, force_py=True)


def test_layer_table_model(qtmodeltester):
    model = LayerTableModel()
    model.set_rows(
        [
            TensorRow(-1, "token_embd.weight", "Q8_0", (64, 300), 20400),
            TensorRow(0, "blk.0.attn_q.weight", "Q4_1", (64, 64), 2560),
        ]
    )
    assert model.total_bytes() == 22960 and model.n_layers() == 1
    qtmodeltester.check(model, force_py=True)


def test_slot_table_model_follows_report(qtmodeltester):
    model = SlotTableModel()
    model.set_figures(MemoryFigures(kv_bytes=2000, kv_per_seq_used=(500, 0)))
    assert model.index(0, 2).data() == "50.0 %"
    model.set_figures(MemoryFigures(kv_bytes=2000, kv_per_seq_used=(600, 10)))
    qtmodeltester.check(model, force_py=True)
    # a unified pool: any slot may fill all of it, so a share never passes 100 %
    model.set_figures(
        MemoryFigures(kv_bytes=2000, kv_seq_capacity_bytes=2000, kv_per_seq_used=(1500, 0))
    )
    assert model.index(0, 2).data() == "75.0 %"


def test_starter_list_model(qtmodeltester):
    model = StarterListModel()
    model.set_starters(
        [StarterModel("smollm2", "d", 1 << 20, None), StarterModel("gemma", "", 0, "/x")]
    )
    assert "not downloaded" in model.index(0).data() and "downloaded" in model.index(1).data()
    qtmodeltester.check(model, force_py=True)
