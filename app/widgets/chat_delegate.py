"""ChatDelegate: paints one message as a bubble with Markdown, code blocks, stats and actions.

Layout is computed once per (text, width, state) and cached, so painting a long conversation stays
cheap: the view asks for a row's size and layout several times per paint. A streaming reply
re-lays out only its own row, and its superseded versions are not kept.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field

from PySide6.QtCore import QEvent, QPointF, QRect, QRectF, QSize, Qt, Signal
from PySide6.QtGui import (
    QAbstractTextDocumentLayout,
    QColor,
    QFont,
    QFontDatabase,
    QImage,
    QPainter,
    QPalette,
    QPixmap,
    QTextCharFormat,
    QTextCursor,
    QTextDocument,
    QTextFormat,
)
from PySide6.QtWidgets import QStyledItemDelegate, QStyleOptionViewItem, QToolTip

from ..format import replay_record, reply_summary
from ..item_models.chat_list_model import (
    ERROR_ROLE,
    ROLE_ROLE,
    STATS_ROLE,
    STREAMING_ROLE,
    ChatListModel,
    RowView,
)
from ..theme import is_dark, mix

MARGIN, GAP, PAD, RADIUS = 16, 10, 12, 10
CACHE_SIZE = 256
THUMB_H, THUMB_MAX_W, THUMB_GAP = 96, 160, 6  # attached images in a bubble
UNREADABLE = "image unreadable"


@dataclass
class _Layout:
    bubble: QRect
    doc: QTextDocument
    doc_origin: QPointF
    header: QRect
    footer: QRect  # stats line (assistant) or empty
    actions: list[tuple[str, QRect]] = field(default_factory=list)
    code_copies: list[tuple[str, QRect]] = field(default_factory=list)
    thumbs: list[QRect] = field(default_factory=list)  # one per attached image, in order

    def moved(self, dx: int, dy: int) -> _Layout:
        if not dx and not dy:
            return self
        return _Layout(
            self.bubble.translated(dx, dy),
            self.doc,
            self.doc_origin + QPointF(dx, dy),
            self.header.translated(dx, dy),
            self.footer.translated(dx, dy),
            [(n, r.translated(dx, dy)) for n, r in self.actions],
            [(t, r.translated(dx, dy)) for t, r in self.code_copies],
            [r.translated(dx, dy) for r in self.thumbs],
        )


class ChatDelegate(QStyledItemDelegate):
    copy_requested = Signal(int)
    edit_requested = Signal(int)
    regenerate_requested = Signal(int)
    code_copy_requested = Signal(str)

    def __init__(self, parent=None):
        super().__init__(parent)
        self._docs: OrderedDict[tuple, tuple[QTextDocument, float]] = OrderedDict()
        self._layouts: OrderedDict[tuple, _Layout] = (
            OrderedDict()
        )  # at the origin, by _layout's key
        # the streaming row's current document and layout (key, value): it grows every frame, so
        # its earlier versions are never asked for again and are not kept
        self._live_doc: tuple[tuple, tuple[QTextDocument, float]] | None = None
        self._live_layout: tuple[tuple, _Layout] | None = None
        self.hover_row = -1
        self.thumbnails = ThumbnailCache()

    # documents ------------------------------------------------------------------------------
    def _document(
        self, text: str, width: int, palette: QPalette, font: QFont, streaming: bool = False
    ) -> tuple[QTextDocument, float]:
        """The laid-out document and its ideal width at `width` (before a user bubble shrinks it)."""
        key = (text, width, palette.color(QPalette.ColorRole.Text).rgb(), font.pointSizeF())
        if streaming:
            if self._live_doc is None or self._live_doc[0] != key:
                self._live_doc = (key, self._new_document(text, width, palette, font))
            return self._live_doc[1]
        cached = self._docs.get(key)
        if cached is not None:
            self._docs.move_to_end(key)
            return cached
        self._docs[key] = self._new_document(text, width, palette, font)
        if len(self._docs) > CACHE_SIZE:
            self._docs.popitem(last=False)
        return self._docs[key]

    @staticmethod
    def _new_document(
        text: str, width: int, palette: QPalette, font: QFont
    ) -> tuple[QTextDocument, float]:
        doc = QTextDocument()
        doc.setDefaultFont(font)
        doc.setDocumentMargin(0)
        doc.setMarkdown(text or "…")
        _style_code_blocks(doc, palette)
        doc.setTextWidth(width)
        return doc, doc.idealWidth()

    # layout ---------------------------------------------------------------------------------
    @staticmethod
    def _row(index) -> RowView:
        model = index.model()
        if isinstance(model, ChatListModel):  # one Python call instead of six data() round trips
            return model.row_view(index.row())
        return RowView(
            index.data() or "",
            index.data(ROLE_ROLE),
            index.data(STATS_ROLE),
            bool(index.data(STREAMING_ROLE)),
            index.data(ERROR_ROLE) or "",
            index.row() == model.rowCount() - 1,
        )

    def _layout(self, option, index) -> _Layout:
        """The row's layout in option.rect: computed at the origin once per key, then moved."""
        rect, v = option.rect, self._row(index)
        streaming = v.streaming
        key = (
            v.text,
            rect.width(),
            v.role,
            streaming,
            self._footer_text(v),
            tuple(i.sha256 for i in v.images),
            tuple(self._action_names(v)),
            option.palette.color(QPalette.ColorRole.Text).rgb(),
            option.font.pointSizeF(),
        )
        if streaming:
            lay = (
                self._live_layout[1] if self._live_layout and self._live_layout[0] == key else None
            )
        else:
            lay = self._layouts.get(key)
        if lay is None:
            at_origin = QStyleOptionViewItem(option)
            at_origin.rect = QRect(0, 0, rect.width(), rect.height())
            lay = self._compute_layout(at_origin, v)
            if streaming:
                self._live_layout = (key, lay)
            else:
                self._layouts[key] = lay
                if len(self._layouts) > CACHE_SIZE:
                    self._layouts.popitem(last=False)
        elif not streaming:
            self._layouts.move_to_end(key)
        return lay.moved(rect.left(), rect.top())

    def _compute_layout(self, option, v: RowView) -> _Layout:
        is_user = v.role == "user"
        avail = max(option.rect.width() - 2 * MARGIN, 120)
        max_w = int(avail * (0.78 if is_user else 0.92))
        fm = option.fontMetrics
        doc, ideal = self._document(
            v.text, max_w - 2 * PAD, option.palette, option.font, v.streaming
        )
        content_w = int(ideal) + 1 if is_user else max_w - 2 * PAD
        thumbs, thumbs_w, thumbs_h = self._thumb_rects(v.images, max_w - 2 * PAD)
        content_w = max(content_w, thumbs_w)
        actions = self._action_names(v)
        actions_w = sum(fm.horizontalAdvance(a) + 18 for a in actions)
        stats = self._footer_text(v)  # a short user message still shows all of "⚠ Not saved: …"
        width = min(
            max(
                content_w + 2 * PAD, actions_w + 2 * PAD, fm.horizontalAdvance(stats) + 2 * PAD, 120
            ),
            max_w,
        )
        if is_user and doc.textWidth() != width - 2 * PAD:
            doc.setTextWidth(width - 2 * PAD)
        header_h, line_h = fm.height() + 4, fm.height() + 6
        footer_h = line_h if stats else 0
        height = PAD + header_h + thumbs_h + int(doc.size().height()) + footer_h + line_h + PAD // 2
        left = option.rect.right() - MARGIN - width + 1 if is_user else option.rect.left() + MARGIN
        bubble = QRect(left, option.rect.top() + GAP // 2, width, height)
        header = QRect(left + PAD, bubble.top() + PAD - 2, width - 2 * PAD, header_h)
        doc_origin = QPointF(left + PAD, header.bottom() + 2 + thumbs_h)
        footer = QRect(
            left + PAD, int(doc_origin.y() + doc.size().height()) + 4, width - 2 * PAD, footer_h
        )
        lay = _Layout(bubble, doc, doc_origin, header, footer)
        lay.thumbs = [r.translated(left + PAD, header.bottom() + 2) for r in thumbs]
        x, y = left + PAD, footer.bottom() + 2 if footer_h else footer.top()
        for name in actions:
            w = fm.horizontalAdvance(name) + 10
            lay.actions.append((name, QRect(x, y, w, line_h - 2)))
            x += w + 8
        lay.code_copies = _code_copy_rects(doc, doc_origin, fm)
        return lay

    def _thumb_rects(self, images, width: int) -> tuple[list[QRect], int, int]:
        """Each image's rect from the top-left of the thumbnail rows, the rows' width and
        height (with the gap under them): THUMB_H high, wrapped at `width`."""
        rects: list[QRect] = []
        x = y = used_w = 0
        for image in images:
            w = min(self.thumbnails.width_at(image, THUMB_H), width)
            if x and x + w > width:
                x, y = 0, y + THUMB_H + THUMB_GAP
            rects.append(QRect(x, y, w, THUMB_H))
            x += w + THUMB_GAP
            used_w = max(used_w, x - THUMB_GAP)
        height = y + THUMB_H + THUMB_GAP + 2 if rects else 0
        return rects, used_w, height

    @staticmethod
    def _action_names(v: RowView) -> list[str]:
        if v.streaming:
            return []
        if v.role == "user":
            return ["Copy", "Edit"]
        return ["Copy", "Regenerate"] if v.is_last else ["Copy"]

    @staticmethod
    def _footer_text(v: RowView) -> str:
        if v.error:
            return "⚠ " + v.error.splitlines()[0]
        if v.role != "assistant" or v.streaming:
            return ""
        return reply_summary(v.stats or {})

    def sizeHint(self, option, index) -> QSize:  # noqa: N802
        lay = self._layout(option, index)
        return QSize(option.rect.width() or 400, lay.bubble.height() + GAP)

    # painting -------------------------------------------------------------------------------
    def paint(self, painter: QPainter, option, index) -> None:
        lay = self._layout(option, index)
        pal = option.palette
        painter.save()
        painter.setRenderHint(QPainter.RenderHint.Antialiasing)
        painter.setPen(Qt.PenStyle.NoPen)
        painter.setBrush(_bubble_colour(pal, index.data(ROLE_ROLE)))
        painter.drawRoundedRect(QRectF(lay.bubble), RADIUS, RADIUS)
        self._paint_header(painter, option, index, lay)
        self._paint_thumbs(painter, option, index, lay)
        painter.translate(lay.doc_origin)
        ctx = QAbstractTextDocumentLayout.PaintContext()
        ctx.palette.setColor(QPalette.ColorRole.Text, pal.color(QPalette.ColorRole.Text))
        lay.doc.documentLayout().draw(painter, ctx)
        painter.translate(-lay.doc_origin)
        self._paint_footer(painter, option, index, lay)
        painter.restore()

    def _paint_header(self, painter, option, index, lay: _Layout) -> None:
        font = QFont(option.font)
        font.setBold(True)
        painter.setFont(font)
        dim = mix(
            option.palette.color(QPalette.ColorRole.Text),
            option.palette.color(QPalette.ColorRole.Base),
            0.35,
        )
        painter.setPen(dim)
        role = index.data(ROLE_ROLE)
        label = {"user": "You", "assistant": "Assistant"}.get(role, role.capitalize())
        if index.data(STREAMING_ROLE):
            phase = self._row(index).phase
            label += f"  · {phase}…" if phase else "  · generating…"
        painter.drawText(
            lay.header, Qt.AlignmentFlag.AlignLeft | Qt.AlignmentFlag.AlignVCenter, label
        )
        painter.setFont(option.font)

    def _paint_thumbs(self, painter, option, index, lay: _Layout) -> None:
        images = self._row(index).images
        for image, rect in zip(images, lay.thumbs, strict=False):
            pixmap = self.thumbnails.pixmap(image, THUMB_H)
            if pixmap is not None:
                painter.drawPixmap(rect, pixmap)
                continue
            # a blob that no longer decodes (or went missing): say so where the image was
            pal = option.palette
            painter.setPen(
                mix(pal.color(QPalette.ColorRole.Text), pal.color(QPalette.ColorRole.Base), 0.5)
            )
            painter.setBrush(pal.color(QPalette.ColorRole.Base))
            painter.drawRoundedRect(QRectF(rect).adjusted(0.5, 0.5, -0.5, -0.5), 6, 6)
            painter.drawText(
                rect, Qt.AlignmentFlag.AlignCenter | Qt.TextFlag.TextWordWrap, UNREADABLE
            )
            painter.setBrush(Qt.BrushStyle.NoBrush)
            painter.setPen(Qt.PenStyle.NoPen)

    def thumbnail_rects(self, option, index) -> list[QRect]:
        """For tests: where each attached image of a row is drawn."""
        return list(self._layout(option, index).thumbs)

    def _paint_footer(self, painter, option, index, lay: _Layout) -> None:
        pal = option.palette
        small = QFont(option.font)
        small.setPointSizeF(max(option.font.pointSizeF() - 1, 7))
        painter.setFont(small)
        dim = mix(pal.color(QPalette.ColorRole.Text), pal.color(QPalette.ColorRole.Base), 0.45)
        text = self._footer_text(self._row(index))
        if text:
            painter.setPen(QColor("#d9534f") if index.data(ERROR_ROLE) else dim)
            elided = painter.fontMetrics().elidedText(
                text, Qt.TextElideMode.ElideRight, lay.footer.width()
            )
            painter.drawText(
                lay.footer, Qt.AlignmentFlag.AlignLeft | Qt.AlignmentFlag.AlignVCenter, elided
            )
        link = pal.color(QPalette.ColorRole.Link)
        hovered = index.row() == self.hover_row
        for name, rect in lay.actions + lay.code_copies:
            painter.setPen(link if hovered or (name, rect) in lay.code_copies else dim)
            label = "Copy code" if (name, rect) in lay.code_copies else name
            painter.drawText(rect, Qt.AlignmentFlag.AlignCenter, label)

    # interaction ----------------------------------------------------------------------------
    def editorEvent(self, event, model, option, index) -> bool:  # noqa: N802
        if event.type() != QEvent.Type.MouseButtonRelease:
            return False
        lay = self._layout(option, index)
        pos = event.position().toPoint()
        for text, rect in lay.code_copies:
            if rect.contains(pos):
                self.code_copy_requested.emit(text)
                return True
        for name, rect in lay.actions:
            if rect.contains(pos):
                {
                    "Copy": self.copy_requested,
                    "Edit": self.edit_requested,
                    "Regenerate": self.regenerate_requested,
                }[name].emit(index.row())
                return True
        return False

    def helpEvent(self, event, view, option, index) -> bool:  # noqa: N802
        lay = self._layout(option, index)
        stats = index.data(STATS_ROLE) or {}
        if lay.footer.contains(event.pos()) and stats:
            QToolTip.showText(event.globalPos(), "Replay record\n" + replay_record(stats), view)
            return True
        return super().helpEvent(event, view, option, index)

    def action_rects(self, option, index) -> dict[str, QRect]:
        """For tests: where each action of a row is drawn."""
        return dict(self._layout(option, index).actions)


class ThumbnailCache:
    """Scaled pixmaps of attached images by (sha256, height); None for bytes Qt cannot decode.
    Decoded once: the delegate asks for them at every layout and paint."""

    def __init__(self, size: int = CACHE_SIZE) -> None:
        self._pixmaps: OrderedDict[tuple[str, int], QPixmap | None] = OrderedDict()
        self._size = size

    def pixmap(self, image, height: int) -> QPixmap | None:
        key = (image.sha256, height)
        if key in self._pixmaps:
            self._pixmaps.move_to_end(key)
            return self._pixmaps[key]
        decoded = QImage.fromData(image.data) if image.data else QImage()
        pixmap = None
        if not decoded.isNull():
            scaled = decoded.scaledToHeight(height, Qt.TransformationMode.SmoothTransformation)
            if scaled.width() > THUMB_MAX_W:  # a panorama: its middle, not a sliver
                scaled = scaled.copy((scaled.width() - THUMB_MAX_W) // 2, 0, THUMB_MAX_W, height)
            pixmap = QPixmap.fromImage(scaled)
        self._pixmaps[key] = pixmap
        if len(self._pixmaps) > self._size:
            self._pixmaps.popitem(last=False)
        return pixmap

    def width_at(self, image, height: int) -> int:
        pixmap = self.pixmap(image, height)
        return pixmap.width() if pixmap is not None else height  # the placeholder is square


def _bubble_colour(pal: QPalette, role: str) -> QColor:
    base, accent = pal.color(QPalette.ColorRole.Base), pal.color(QPalette.ColorRole.Highlight)
    if role == "user":
        return mix(base, accent, 0.28 if is_dark(pal) else 0.14)
    return pal.color(QPalette.ColorRole.AlternateBase)


def _style_code_blocks(doc: QTextDocument, pal: QPalette) -> None:
    """Monospace font and a tinted background on fenced code blocks."""
    mono = QFontDatabase.systemFont(QFontDatabase.SystemFont.FixedFont)
    bg = mix(pal.color(QPalette.ColorRole.Base), pal.color(QPalette.ColorRole.Text), 0.08)
    char_fmt = QTextCharFormat()
    char_fmt.setFont(mono)
    block = doc.begin()
    while block.isValid():
        if block.blockFormat().hasProperty(QTextFormat.Property.BlockCodeFence):
            cursor = QTextCursor(block)
            fmt = block.blockFormat()
            fmt.setBackground(bg)
            fmt.setLeftMargin(6)
            cursor.setBlockFormat(fmt)
            cursor.select(QTextCursor.SelectionType.BlockUnderCursor)
            cursor.mergeCharFormat(char_fmt)
        block = block.next()


def _code_copy_rects(doc: QTextDocument, origin: QPointF, fm) -> list[tuple[str, QRect]]:
    """One 'Copy code' hit area at the top-right of each fenced code block."""
    out, block, lines, first = [], doc.begin(), [], None
    layout = doc.documentLayout()
    w = fm.horizontalAdvance("Copy code") + 10
    while True:
        fenced = block.isValid() and block.blockFormat().hasProperty(
            QTextFormat.Property.BlockCodeFence
        )
        if fenced:
            first = first or block
            lines.append(block.text())
        elif first is not None:
            r = layout.blockBoundingRect(first).translated(origin)
            out.append(
                ("\n".join(lines), QRect(int(r.right()) - w, int(r.top()), w, fm.height() + 2))
            )
            lines, first = [], None
        if not block.isValid():
            return out
        block = block.next()
