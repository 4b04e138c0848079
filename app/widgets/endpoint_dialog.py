"""EndpointDialog: add or edit a remote server: a name, its URL and an optional API key.

The URL is checked when the user presses Save (not an http(s) address, or one already in the
list: the dialog stays open and says why); whether the server answers is the panel's business,
on a worker thread, after the dialog closes. The note under the key says where it will be kept.
"""

from __future__ import annotations

from PySide6.QtWidgets import (
    QDialog,
    QDialogButtonBox,
    QFormLayout,
    QLabel,
    QLineEdit,
    QVBoxLayout,
    QWidget,
)

from ..dto import EndpointInfo
from ..engine_api import RemoteApi
from ..errors import RemoteError
from ..key_store import KeyStore


class EndpointDialog(QDialog):
    def __init__(
        self,
        remote: RemoteApi,
        keys: KeyStore,
        taken: list[str],
        endpoint: EndpointInfo | None = None,
        api_key: str = "",
        parent: QWidget | None = None,
    ):
        super().__init__(parent)
        self._remote, self._taken = remote, set(taken)
        self.old = endpoint  # None: adding
        self.endpoint: EndpointInfo | None = None  # set on Save
        self.api_key = ""
        self.setWindowTitle("Edit remote server" if endpoint else "Add remote server")
        self.setMinimumWidth(520)
        self._build_ui(keys)
        if endpoint is not None:
            self.name_edit.setText(endpoint.name)
            self.url_edit.setText(endpoint.url)
            self.key_edit.setText(api_key)

    def _build_ui(self, keys: KeyStore) -> None:
        col = QVBoxLayout(self)
        intro = QLabel(
            "Any OpenAI-compatible server: another ggstation, llama-server, a Ray Serve "
            "deployment, vLLM or a hosted API.",
            wordWrap=True,
            objectName="dim",
        )
        col.addWidget(intro)
        form = QFormLayout()
        self.name_edit = QLineEdit(placeholderText="e.g. GPU box (optional)")
        self.url_edit = QLineEdit(placeholderText="http://192.168.1.20:8080")
        self.key_edit = QLineEdit(placeholderText="optional", echoMode=QLineEdit.EchoMode.Password)
        self.key_note = QLabel(keys.describe(), wordWrap=True, objectName="dim")
        form.addRow("Name", self.name_edit)
        form.addRow("URL", self.url_edit)
        form.addRow("API key", self.key_edit)
        form.addRow("", self.key_note)
        col.addLayout(form)
        self.error_label = QLabel("", wordWrap=True, objectName="error")
        self.error_label.hide()
        col.addWidget(self.error_label)
        buttons = QDialogButtonBox(
            QDialogButtonBox.StandardButton.Save | QDialogButtonBox.StandardButton.Cancel
        )
        buttons.accepted.connect(self.accept)
        buttons.rejected.connect(self.reject)
        col.addWidget(buttons)

    def accept(self) -> None:
        try:
            url = self._remote.normalize_url(self.url_edit.text())
        except RemoteError as e:
            self._show_error(str(e))
            return
        if url in self._taken:
            self._show_error(f"{url} is already in the list.")
            return
        self.endpoint = EndpointInfo(self.name_edit.text().strip(), url)
        self.api_key = self.key_edit.text().strip()
        super().accept()

    def _show_error(self, text: str) -> None:
        self.error_label.setText(text)
        self.error_label.show()
        self.url_edit.setFocus()
