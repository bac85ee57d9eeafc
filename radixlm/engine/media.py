"""Images in a request: fetch (data: URL, base64, file://, or http(s) from --allowed-media-domains)
and decode them with bounds, on the tokenizer threads (never the event loop).

Every failure is a ValueError naming the request field, which the routes answer with a 400: a file
past --media-url-max-file-size-mb, a URL to a host not allowed, a slow server (the timeout), a file
that is not an image or is cut short, a decompression bomb (more pixels than --max-image-pixels,
checked from the header before any pixel is decoded).
"""

from __future__ import annotations

import base64
import binascii
import io
import os
import urllib.parse
from dataclasses import dataclass

MB = 2**20


@dataclass(frozen=True)
class MediaConfig:
    allowed_media_domains: tuple[str, ...] = ()  # hosts http(s) images may come from; empty: none
    max_file_bytes: int = 16 * MB  # one image's encoded bytes, whatever its source
    url_timeout: float = 10.0  # seconds a download may take in all
    max_image_pixels: int = 64 * MB  # width x height; more is a decompression bomb
    allowed_local_media_path: str = ""  # the directory file:// images may come from; empty: none

    def __post_init__(self):
        if self.max_file_bytes < 1:
            raise ValueError(
                f"media_url_max_file_size_mb must be > 0, got {self.max_file_bytes / MB}"
            )
        if not self.url_timeout > 0:
            raise ValueError(f"media_url_timeout must be > 0, got {self.url_timeout}")

    @classmethod
    def from_server_args(cls, args) -> MediaConfig:
        domains = args.allowed_media_domains or []
        if isinstance(domains, str):
            domains = [d for d in domains.split(",") if d]
        return cls(
            tuple(d.strip().lower() for d in domains),
            int(args.media_url_max_file_size_mb * MB),
            float(args.media_url_timeout),
            int(args.max_image_pixels),
            args.allowed_local_media_path or "",
        )


def image_bytes(source: str, field: str, config: MediaConfig) -> bytes:
    """The encoded image `source` names (field: where it came from in the request, for errors)."""
    if not isinstance(source, str) or not source:
        raise ValueError(
            f"{field} must be a non-empty string (a data: URL, base64, file:// or http(s) URL)"
        )
    if source.startswith("data:"):
        header, sep, payload = source.partition(",")
        if not sep or ";base64" not in header:
            raise ValueError(f"{field}: a data URL must be data:<mime>;base64,<data>")
        return _b64(payload, field, config)
    scheme = urllib.parse.urlsplit(source).scheme.lower()
    if scheme in ("http", "https"):
        return _download(source, field, config)
    if scheme == "file":
        return _read_file(urllib.parse.unquote(urllib.parse.urlsplit(source).path), field, config)
    if scheme:
        raise ValueError(
            f"{field}: URL scheme {scheme!r} is not supported (data:, file://, http(s)://)"
        )
    return _b64(source, field, config)  # SGLang's image_data also takes bare base64


def _b64(payload: str, field: str, config: MediaConfig) -> bytes:
    if len(payload) * 3 // 4 > config.max_file_bytes:
        raise ValueError(
            f"{field}: the image is larger than {config.max_file_bytes // MB} MB "
            "(--media-url-max-file-size-mb)"
        )
    try:
        return base64.b64decode(payload, validate=True)
    except (binascii.Error, ValueError):
        raise ValueError(f"{field}: not valid base64") from None


def _read_file(path: str, field: str, config: MediaConfig) -> bytes:
    # A request must not read the server's files (vLLM's --allowed-local-media-path): only below the
    # directory given, after symlinks resolve; the same error whether or not the file exists.
    root = config.allowed_local_media_path
    real = os.path.realpath(path)
    if not root or os.path.commonpath([real, os.path.realpath(root)]) != os.path.realpath(root):
        raise ValueError(
            f"{field}: file:// images are allowed only below --allowed-local-media-path"
            + ("" if root else " (not set)")
        )
    path = real
    try:
        with open(path, "rb") as f:
            if os.fstat(f.fileno()).st_size > config.max_file_bytes:
                raise ValueError(
                    f"{field}: the file is larger than {config.max_file_bytes // MB} MB "
                    "(--media-url-max-file-size-mb)"
                )
            return f.read(config.max_file_bytes + 1)
    except OSError as e:
        raise ValueError(f"{field}: cannot read {path!r}: {e.strerror}") from None


def _allowed(host: str, domains: tuple[str, ...]) -> bool:
    host = host.lower().rstrip(".")
    return any(host == d or host.endswith("." + d) for d in domains)


def _download(url: str, field: str, config: MediaConfig) -> bytes:
    import httpx

    host = urllib.parse.urlsplit(url).hostname or ""
    if not _allowed(host, config.allowed_media_domains):
        raise ValueError(f"{field}: images from {host!r} are not allowed (--allowed-media-domains)")
    limit = config.max_file_bytes
    try:
        # No redirects: a redirect could lead to a host that is not allowed.
        with httpx.stream("GET", url, timeout=config.url_timeout, follow_redirects=False) as r:
            if r.status_code != 200:
                raise ValueError(f"{field}: fetching the image answered HTTP {r.status_code}")
            if int(r.headers.get("content-length") or 0) > limit:
                raise ValueError(
                    f"{field}: the image is larger than {limit // MB} MB"
                    " (--media-url-max-file-size-mb)"
                )
            buf = bytearray()
            for chunk in r.iter_bytes():
                buf += chunk
                if len(buf) > limit:
                    raise ValueError(
                        f"{field}: the image is larger than {limit // MB} MB "
                        "(--media-url-max-file-size-mb)"
                    )
            return bytes(buf)
    except httpx.TimeoutException:
        raise ValueError(
            f"{field}: fetching the image took longer than {config.url_timeout} s"
        ) from None
    except httpx.HTTPError as e:
        raise ValueError(f"{field}: cannot fetch the image: {type(e).__name__}") from None


def decode_image(data: bytes, field: str, config: MediaConfig):
    """An RGB PIL image, its size checked from the header before the pixels are decoded."""
    from PIL import Image

    try:
        img = Image.open(io.BytesIO(data))
        w, h = img.size
        if w * h > config.max_image_pixels:
            raise ValueError(
                f"{field}: the image has {w}x{h} pixels, more than {config.max_image_pixels} "
                "(--max-image-pixels): refused as a decompression bomb"
            )
        img.load()
        return img.convert("RGB")
    except Image.DecompressionBombError:
        raise ValueError(f"{field}: the image is a decompression bomb (too many pixels)") from None
    except ValueError:
        raise
    except (
        OSError,
        SyntaxError,
        Image.UnidentifiedImageError,
    ) as e:  # truncated, corrupt, not an image
        raise ValueError(f"{field}: not a decodable image ({e})") from None


def load_image(source: str, field: str, config: MediaConfig | None = None):
    config = config or MediaConfig()
    return decode_image(image_bytes(source, field, config), field, config)
