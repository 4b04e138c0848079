"""SamplingPanel: system prompt, sampling settings and named presets."""

from __future__ import annotations

from PySide6.QtCore import Signal
from PySide6.QtWidgets import (
    QComboBox,
    QDoubleSpinBox,
    QFormLayout,
    QHBoxLayout,
    QInputDialog,
    QLabel,
    QPlainTextEdit,
    QPushButton,
    QSpinBox,
    QVBoxLayout,
    QWidget,
)

from ..dto import SamplingSettings
from ..settings import BUILTIN_PRESETS

_FIELDS = {  # name: (label, kind, min, max, step, decimals, tooltip)
    "temperature": ("Temperature", float, 0.0, 5.0, 0.05, 2, "0 = always the most likely token"),
    "top_k": ("Top-k", int, 0, 1000, 1, 0, "Keep the k most likely tokens (0 = all)"),
    "top_p": (
        "Top-p",
        float,
        0.0,
        1.0,
        0.01,
        2,
        "Keep the smallest set whose probability reaches p",
    ),
    "min_p": (
        "Min-p",
        float,
        0.0,
        1.0,
        0.01,
        2,
        "Drop tokens below p × the top token's probability",
    ),
    "repeat_penalty": ("Repeat penalty", float, 0.5, 2.0, 0.01, 2, "1.0 = off"),
    "seed": (
        "Seed",
        int,
        -1,
        2**31 - 1,
        1,
        0,
        "-1 = a new random seed per reply (recorded under it)",
    ),
    "max_tokens": ("Max tokens", int, 1, 131072, 16, 0, "Longest reply"),
}


class SamplingPanel(QWidget):
    sampling_changed = Signal(object)  # SamplingSettings
    system_prompt_changed = Signal(str)
    preset_saved = Signal(str, object)  # name, SamplingSettings

    def __init__(self, presets: dict[str, SamplingSettings], parent=None):
        super().__init__(parent)
        self._presets = dict(presets)
        self._loading = False
        layout = QVBoxLayout(self)
        layout.setContentsMargins(12, 12, 12, 12)
        layout.addWidget(QLabel("System prompt", objectName="sectionTitle"))
        layout.addWidget(self._build_system_prompt())
        layout.addSpacing(8)
        layout.addWidget(QLabel("Sampling", objectName="sectionTitle"))
        layout.addLayout(self._build_presets())
        layout.addLayout(self._build_form())
        layout.addStretch(1)

    def _build_system_prompt(self) -> QWidget:
        self.system_prompt = QPlainTextEdit(placeholderText="Optional instructions for every reply")
        self.system_prompt.setFixedHeight(self.fontMetrics().lineSpacing() * 5 + 12)
        self.system_prompt.textChanged.connect(
            lambda: self.system_prompt_changed.emit(self.system_prompt.toPlainText())
        )
        return self.system_prompt

    def _build_presets(self) -> QHBoxLayout:
        row = QHBoxLayout()
        self.preset_combo = QComboBox()
        self.preset_combo.addItems(list(self._presets))
        self.preset_combo.currentTextChanged.connect(self.apply_preset)
        save = QPushButton("Save as…")
        save.setToolTip("Save these settings as a named preset")
        save.clicked.connect(self._save_preset)
        row.addWidget(self.preset_combo, 1)
        row.addWidget(save)
        return row

    def _build_form(self) -> QFormLayout:
        form = QFormLayout()
        self.inputs: dict[str, QSpinBox | QDoubleSpinBox] = {}
        for name, (label, kind, lo, hi, step, decimals, tip) in _FIELDS.items():
            box = QDoubleSpinBox(decimals=decimals) if kind is float else QSpinBox()
            box.setRange(lo, hi)
            box.setSingleStep(step)
            box.setToolTip(tip)
            if name == "seed":
                box.setSpecialValueText("random")
            box.valueChanged.connect(self._on_value_changed)
            self.inputs[name] = box
            form.addRow(label, box)
        return form

    def set_unsupported(self, names: set[str], why: str = "") -> None:
        """Grey out the fields the chat's server ignores (a plain OpenAI server has no top-k,
        min-p or repeat penalty); their values are kept for when it changes back."""
        for name, box in self.inputs.items():
            off = name in names
            box.setEnabled(not off)
            box.setToolTip(why if off else _FIELDS[name][6])

    def set_values(
        self, s: SamplingSettings, system_prompt: str | None = None, preset: str = ""
    ) -> None:
        self._loading = True
        values = s.as_dict()
        for name, box in self.inputs.items():
            box.setValue(values[name])
        if system_prompt is not None:
            self.system_prompt.setPlainText(system_prompt)
        if preset:
            self.preset_combo.setCurrentText(preset)
        self._loading = False

    def values(self) -> SamplingSettings:
        return SamplingSettings(**{n: _FIELDS[n][1](b.value()) for n, b in self.inputs.items()})

    def apply_preset(self, name: str) -> None:
        if name in self._presets:
            self.set_values(self._presets[name])
            self.sampling_changed.emit(self.values())

    def _on_value_changed(self, _v) -> None:
        if not self._loading:
            self.sampling_changed.emit(self.values())

    def _save_preset(self) -> None:
        name, ok = QInputDialog.getText(self, "Save preset", "Preset name:")
        name = name.strip()
        if ok and name and name not in BUILTIN_PRESETS:
            self._presets[name] = self.values()
            if self.preset_combo.findText(name) < 0:
                self.preset_combo.addItem(name)
            self.preset_combo.setCurrentText(name)
            self.preset_saved.emit(name, self.values())
