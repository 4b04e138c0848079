"""ServerPanel: host, port, API key and CORS for the embedded server; its URLs and a request log."""

from __future__ import annotations

import re
import time

import psutil
from PySide6.QtCore import Qt, Signal
from PySide6.QtGui import QGuiApplication
from PySide6.QtWidgets import (
    QCheckBox,
    QComboBox,
    QFormLayout,
    QGroupBox,
    QHBoxLayout,
    QLabel,
    QLineEdit,
    QPlainTextEdit,
    QPushButton,
    QSpinBox,
    QToolButton,
    QVBoxLayout,
    QWidget,
)

from ..dto import ServerSettings

ENDPOINTS = ("/v1/chat/completions", "/v1/completions", "/v1/models", "/health")


def machine_addresses() -> list[str]:
    addrs = ["127.0.0.1", "0.0.0.0"]
    for entries in psutil.net_if_addrs().values():
        for a in entries:
            if a.family.name == "AF_INET" and a.address not in addrs:
                addrs.append(a.address)
    return addrs


class ServerPanel(QWidget):
    start_requested = Signal(object)  # ServerSettings
    stop_requested = Signal()

    def __init__(self, settings: ServerSettings, parent=None):
        super().__init__(parent)
        self.url = ""
        layout = QVBoxLayout(self)
        layout.setContentsMargins(12, 12, 12, 12)
        top = QHBoxLayout()
        top.addWidget(self._build_settings(settings), 1)
        top.addWidget(self._build_urls(), 1)
        layout.addLayout(top)
        log = QGroupBox("Request log")
        self.log = QPlainTextEdit(readOnly=True, maximumBlockCount=2000, objectName="log")
        QVBoxLayout(log).addWidget(self.log)
        layout.addWidget(log, 1)
        self.set_running(None)

    def _build_settings(self, s: ServerSettings) -> QWidget:
        box = QGroupBox("Embedded server (shares the loaded model)")
        form = QFormLayout(box)
        form.setFieldGrowthPolicy(QFormLayout.FieldGrowthPolicy.FieldsStayAtSizeHint)
        self.host = QComboBox(editable=True)
        self.host.setMinimumWidth(self.fontMetrics().horizontalAdvance("255.255.255.255") + 48)
        self.host.addItems(machine_addresses())
        self.host.setCurrentText(s.host)
        self.host.setToolTip("127.0.0.1 = this machine only; 0.0.0.0 = every network interface")
        self.port = QSpinBox(minimum=1, maximum=65535, value=s.port)
        self.port.setMinimumWidth(self.fontMetrics().horizontalAdvance("655350") + 40)
        self.api_key = QLineEdit(
            s.api_key, placeholderText="optional", echoMode=QLineEdit.EchoMode.Password
        )
        self.api_key.setMinimumWidth(self.host.minimumWidth())
        self.cors = QCheckBox("Allow browser pages from other origins (CORS)", checked=s.cors)
        self.toggle_button = QPushButton(
            "Start server", objectName="primary", clicked=self._on_toggle
        )
        self.error = QLabel("", wordWrap=True, objectName="error")
        self.use_port_button = QPushButton("Use a free port", clicked=self._use_suggested_port)
        self.use_port_button.hide()
        form.addRow("Host", self.host)
        form.addRow("Port", self.port)
        form.addRow("API key", self.api_key)
        form.addRow("", self.cors)
        buttons = QHBoxLayout()
        buttons.addWidget(self.toggle_button)
        buttons.addWidget(self.use_port_button)
        buttons.addStretch(1)
        form.addRow("", buttons)
        form.addRow("", self.error)
        return box

    def _build_urls(self) -> QWidget:
        box = QGroupBox("Endpoints")
        self.url_layout = QVBoxLayout(box)
        self.state = QLabel("Stopped", objectName="dim")
        self.url_layout.addWidget(self.state)
        self.url_rows: list[tuple[QLabel, QToolButton]] = []
        for _ in ENDPOINTS:
            row = QHBoxLayout()
            label = QLabel(
                textInteractionFlags=Qt.TextInteractionFlag.TextSelectableByMouse, objectName="mono"
            )
            copy = QToolButton(text="Copy", autoRaise=True)
            copy.clicked.connect(
                lambda _c=False, lab=label: QGuiApplication.clipboard().setText(lab.text())
            )
            row.addWidget(label, 1)
            row.addWidget(copy)
            self.url_layout.addLayout(row)
            self.url_rows.append((label, copy))
        self.url_layout.addStretch(1)
        return box

    # state ----------------------------------------------------------------------------------
    def settings(self) -> ServerSettings:
        return ServerSettings(
            self.host.currentText().strip(),
            self.port.value(),
            self.api_key.text(),
            self.cors.isChecked(),
        )

    def set_running(self, url: str | None, port: int = 0) -> None:
        self.url = url or ""
        if port:
            self.port.setValue(port)  # the port really used (0 or a clash may have changed it)
        running = bool(url)
        self.toggle_button.setText("Stop server" if running else "Start server")
        for w in (self.host, self.port, self.api_key, self.cors):
            w.setEnabled(not running)
        self.state.setText(f"Running on {url}" if running else "Stopped")
        for (label, copy), path in zip(self.url_rows, ENDPOINTS, strict=True):
            label.setText(url + path if running else "")
            label.setVisible(running)
            copy.setVisible(running)
        if running:
            self.show_error("")

    def show_error(self, message: str) -> None:
        self.error.setText(message)
        self.use_port_button.setVisible("is free" in message)

    def append_log(self, line: str) -> None:
        self.log.appendPlainText(f"{time.strftime('%H:%M:%S')}  {line}")

    def _on_toggle(self) -> None:
        if self.url:
            self.stop_requested.emit()
        else:
            self.show_error("")
            self.start_requested.emit(self.settings())

    def _use_suggested_port(self) -> None:
        found = re.search(r"Port (\d+) is free", self.error.text())
        if found:
            self.port.setValue(int(found.group(1)))
        self.show_error("")
