"""Raw files whose headers lie are refused by name (400, nothing stored), and a decoder's error never
shows the server's objects (`<_io.BytesIO object at 0x7f…>`)."""
from __future__ import annotations

import io
import struct
import zipfile

import numpy as np
import pytest
import soundfile

from kiln.registry.models import Blob, Dataset
from tests.conftest import upload
from tests.platform.security.conftest import assert_json_error

pytestmark = pytest.mark.django_db

AUDIO_RECIPE = '{"type": "audio", "input": "input", "sample_rate": 16000, "length": 1600}'
IMAGE_RECIPE = '{"type": "image", "input": "images", "size": [8, 8]}'


def wav(*, bits: int = 16, data_length: int | None = None, code: int = 1, frames: int = 1600) -> bytes:
    """A mono 16 kHz WAV whose fmt and data headers say what the arguments say."""
    samples = b"\0" * (frames * max(bits, 8) // 8)
    block = max(bits, 8) // 8
    fmt = struct.pack("<HHIIHH", code, 1, 16000, 16000 * block, block, bits)
    declared = len(samples) if data_length is None else data_length
    body = b"WAVE" + b"fmt " + struct.pack("<I", len(fmt)) + fmt + b"data" + struct.pack("<I", declared) + samples
    return b"RIFF" + struct.pack("<I", len(body)) + body


def zipped(tmp_path, name: str, data: bytes):
    path = tmp_path / "raw.zip"
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr(name, data)
    return path


def assert_refused(tenant, path, recipe: str, *words):
    response = upload(tenant.client, "/api/v1/datasets/", path, kind="calibration", recipe=recipe)
    body = assert_json_error(response, 400, "invalid_dataset")
    for word in words:
        assert word in body["error"], body["error"]
    assert "0x7" not in body["error"] and "BytesIO" not in body["error"] and "object at" not in body["error"], body["error"]
    assert not Dataset.objects.exists() and not Blob.objects.exists()
    return body


def test_a_wav_declaring_seven_bit_samples(tenant, tmp_path):
    assert_refused(tenant, zipped(tmp_path, "odd.wav", wav(bits=7)), AUDIO_RECIPE, "odd.wav", "7-bit samples")


def test_a_wav_declaring_more_samples_than_it_holds(tenant, tmp_path):
    assert_refused(tenant, zipped(tmp_path, "long.wav", wav(data_length=0xFFFFFFF0)), AUDIO_RECIPE,
                   "long.wav", "4,294,967,280 bytes of samples but holds 3,200")


def test_a_wav_in_an_encoding_outside_pcm_and_float(tenant, tmp_path):
    assert_refused(tenant, zipped(tmp_path, "adpcm.wav", wav(bits=4, code=0x11)), AUDIO_RECIPE, "adpcm.wav", "format 0x0011")


def test_a_file_that_is_not_a_wav_names_no_server_object(tenant, tmp_path):
    assert_refused(tenant, zipped(tmp_path, "noise.wav", b"\x00garbage" * 64), AUDIO_RECIPE, "noise.wav", "not a WAV file")


def test_an_image_pillow_cannot_identify_names_no_server_object(tenant, tmp_path):
    assert_refused(tenant, zipped(tmp_path, "photo.png", b"\x89PNX" + b"\0" * 200), IMAGE_RECIPE, "photo.png", "not an image")


def test_real_wavs_of_every_common_width_are_still_read(tenant, tmp_path):
    path = tmp_path / "sounds.zip"
    with zipfile.ZipFile(path, "w") as archive:
        for subtype in ("PCM_U8", "PCM_16", "PCM_24", "PCM_32", "FLOAT", "DOUBLE", "ULAW"):
            buffer = io.BytesIO()
            soundfile.write(buffer, np.zeros((1600, 2), np.float32), 16000, subtype=subtype, format="WAV")
            archive.writestr(f"{subtype}.wav", buffer.getvalue())
    response = upload(tenant.client, "/api/v1/datasets/", path, kind="calibration", recipe=AUDIO_RECIPE)
    assert response.status_code == 201, response.content
    assert response.json()["samples"] == 7
