"""Image sources and their bounds (radixlm/engine/media.py), without a server: every refusal is a
ValueError that names the field."""

import base64

import pytest

from radixlm.engine.media import MB, MediaConfig, image_bytes, load_image
from tests.vision.checkpoints import png_bytes


def test_sources_give_the_same_image(tmp_path):
    data = png_bytes(5)
    path = tmp_path / "a.png"
    path.write_bytes(data)
    b64 = base64.b64encode(data).decode()
    cfg = MediaConfig(allowed_local_media_path=str(tmp_path))
    for src in ("data:image/png;base64," + b64, b64, f"file://{path}"):
        assert image_bytes(src, "f", cfg) == data
    assert load_image(f"file://{path}", "f", cfg).size == (40, 36)


@pytest.mark.parametrize(
    "src,why",
    [
        ("ftp://host/x.png", "scheme 'ftp'"),
        ("data:image/png,rawbytes", "data:<mime>;base64"),
        ("http://evil.example.org/x.png", "not allowed"),
        ("https://notexample.com/x.png", "not allowed"),  # a suffix that is not a subdomain
        ("file:///etc/passwd", "--allowed-local-media-path (not set)"),
        ("", "non-empty string"),
    ],
)
def test_refused_sources_name_the_field(src, why):
    with pytest.raises(ValueError) as e:
        image_bytes(src, "image_data[3]", MediaConfig(allowed_media_domains=("example.com",)))
    assert str(e.value).startswith("image_data[3]") and why in str(e.value)


def test_size_cap_applies_to_files_and_base64(tmp_path):
    cfg = MediaConfig(max_file_bytes=1 * MB, allowed_local_media_path=str(tmp_path))
    big = tmp_path / "big.bin"
    big.write_bytes(b"\0" * (MB + 1))
    with pytest.raises(ValueError, match="larger than 1 MB"):
        image_bytes(f"file://{big}", "f", cfg)
    with pytest.raises(ValueError, match="larger than 1 MB"):
        image_bytes(base64.b64encode(b"\0" * (MB + 3)).decode(), "f", cfg)


def test_pixel_bound_is_read_from_the_header():
    import io

    from PIL import Image

    buf = io.BytesIO()
    Image.new("RGB", (300, 300)).save(buf, format="PNG")
    with pytest.raises(ValueError, match="90000 pixels|300x300"):
        load_image(
            "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode(),
            "f",
            MediaConfig(max_image_pixels=300 * 299),
        )


def test_file_paths_only_below_the_allowed_directory(tmp_path):
    inside, outside = tmp_path / "media", tmp_path / "secret"
    inside.mkdir(), outside.mkdir()
    (outside / "a.png").write_bytes(png_bytes(1))
    (inside / "link.png").symlink_to(outside / "a.png")
    cfg = MediaConfig(allowed_local_media_path=str(inside))
    for src in (
        f"file://{outside}/a.png",
        f"file://{inside}/../secret/a.png",
        f"file://{inside}/link.png",
        f"file://{inside}/missing.png/../../secret/a.png",
    ):
        with pytest.raises(ValueError, match="only below --allowed-local-media-path"):
            image_bytes(src, "f", cfg)
    with pytest.raises(ValueError, match="cannot read"):
        image_bytes(f"file://{inside}/missing.png", "f", cfg)
