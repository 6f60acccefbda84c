"""Backbone specs and the factory, with tiny random-weight models (no downloads)."""

import json
import logging
import os
import re
import shutil

import numpy as np
import pytest

pytest.importorskip("timm")
pytest.importorskip("open_clip")

import torch  # noqa: E402

from extract import (  # noqa: E402
    BackboneError,
    BackboneSpec,
    create_backbone,
    file_sha256,
    parse_backbone_spec,
)
from extract._testing import register_tiny_open_clip  # noqa: E402
from extract._weights import lite0_key, moco_state_dict  # noqa: E402

# Tiny backbones on tiny images: a second torch thread only waits (conftest.py).
pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.mark.parametrize(
    "spec, expected",
    [
        ("open_clip:ViT-B-32@laion2b_s34b_b79k", ("open_clip", "ViT-B-32", "laion2b_s34b_b79k")),
        ("open_clip:ViT-B-32@/ckpt/clip.pt", ("open_clip", "ViT-B-32", "/ckpt/clip.pt")),
        ("open_clip:RN50", ("open_clip", "RN50", None)),
        (
            "timm:vit_base_patch16_224.mae@/ckpt/mae.pth",
            ("timm", "vit_base_patch16_224.mae", "/ckpt/mae.pth"),
        ),
        ("timm:resnet18", ("timm", "resnet18", None)),
        ("timm:resnet18@ckpt.pth", ("timm", "resnet18", "ckpt.pth")),
        ("  timm:resnet18  ", ("timm", "resnet18", None)),
        ("moco:/ckpt/moco_v2_800ep.pth.tar", ("moco", "resnet50", "/ckpt/moco_v2_800ep.pth.tar")),
        ("moco:resnet18@/ckpt/m.pth", ("moco", "resnet18", "/ckpt/m.pth")),
        # A MoCo path alone may hold an '@' (it was split into an 'arch' '/ckpt/run').
        ("moco:/ckpt/run@2/m.pth.tar", ("moco", "resnet50", "/ckpt/run@2/m.pth.tar")),
        ("moco:./run@2.pth.tar", ("moco", "resnet50", "./run@2.pth.tar")),
        # timm's own hub and folder names, as timm.create_model takes them.
        ("timm:hf-hub:timm/resnet18.a1_in1k", ("timm", "hf-hub:timm/resnet18.a1_in1k", None)),
        ("timm:local-dir:/models/r18@random", ("timm", "local-dir:/models/r18", "random")),
        # A revision of a hub repository, as timm reads it (it was taken for a checkpoint).
        ("timm:hf-hub:timm/r@v2@random", ("timm", "hf-hub:timm/r@v2", "random")),
        ("timm:hf-hub:timm/r@refs/pr/1", ("timm", "hf-hub:timm/r@refs/pr/1", None)),
        (
            "timm:hf-hub:timm/resnet18.a1_in1k@main",
            ("timm", "hf-hub:timm/resnet18.a1_in1k@main", None),
        ),
        ("effnet-lite0", ("effnet-lite0", "tf_efficientnet_lite0", None)),
        ("effnet-lite0@/w/l0.pth", ("effnet-lite0", "tf_efficientnet_lite0", "/w/l0.pth")),
        ("timm:resnet18@/a@b/c.pth", ("timm", "resnet18", "/a@b/c.pth")),
        # No '@': pretrained weights, as in timm and open_clip; '@random' asks for random ones.
        ("timm:resnet18.a1_in1k", ("timm", "resnet18.a1_in1k", None)),
        ("timm:resnet18@random", ("timm", "resnet18", "random")),
        ("timm:resnet18@./random", ("timm", "resnet18", "./random")),
        ("open_clip:RN50@random", ("open_clip", "RN50", "random")),
        ("effnet-lite0@random", ("effnet-lite0", "tf_efficientnet_lite0", "random")),
    ],
)
def test_parse_backbone_spec(spec, expected):
    parsed = parse_backbone_spec(spec)
    assert (parsed.family, parsed.model, parsed.weights) == expected
    # The canonical string parses back to the same spec.
    assert parse_backbone_spec(str(parsed)) == parsed


@pytest.mark.parametrize(
    "spec, match",
    [
        ("", "non-empty string"),
        (None, "non-empty string"),
        ("resnet18", "has no family"),
        ("keras:resnet18", "family must be one of"),
        ("timm:", "names no model"),
        ("timm:@/w.pth", "names no model"),
        ("timm:resnet18@", "empty weights"),
        ("moco:", r"names no checkpoint; use 'moco:\[ARCH@\]CHECKPOINT'"),
        ("moco:resnet50@", "empty weights part after '@'"),
        ("timm:resnet18@imagenet", "must be 'random' or a local checkpoint file"),
        ("effnet-lite0@imagenet", "must be 'random' or a local checkpoint file"),
        ("moco:resnet50@imagenet", "must be a local checkpoint file"),
        ("moco:random", "must be a local checkpoint file"),
        ("effnet-lite0:foo", "takes no model name"),
        # timm's own error was a bare AssertionError ("should only contain one @").
        ("timm:hf-hub:timm/r@a@b", "has more than one '@'; timm takes one revision"),
        ("timm:hf-hub:timm/r@", "empty weights"),
    ],
)
def test_parse_backbone_spec_errors(spec, match):
    with pytest.raises(ValueError, match=match):
        parse_backbone_spec(spec)


@pytest.mark.parametrize(
    "spec, meant",
    [
        ("open-clip:ViT-B-32@laion2b_s34b_b79k", "open_clip:ViT-B-32@laion2b_s34b_b79k"),
        ("openclip:RN50", "open_clip:RN50"),
        ("tim:resnet18@random", "timm:resnet18@random"),
        ("TIMM:resnet18", "timm:resnet18"),
        ("Moco:/ckpt/m.pth.tar", "moco:/ckpt/m.pth.tar"),
        ("effnet-lite@random", "effnet-lite0@random"),
        ("efficientnet-lite0", "effnet-lite0"),
    ],
)
def test_a_misspelt_family_is_refused_with_the_spec_spelt_right(spec, meant):
    # An unknown model had the closest names; a misspelt family only the list of families.
    with pytest.raises(BackboneError, match=re.escape(f"Did you mean {meant!r}?")):
        parse_backbone_spec(spec)
    parse_backbone_spec(meant)


def test_effnet_lite0_weights_that_are_no_file_are_told_its_own_pretrained_spec():
    # It was told that "pretrained timm weights are chosen by the model name, e.g.
    # 'timm:tf_efficientnet_lite0'": a hub download, and other weights than the package's.
    with pytest.raises(BackboneError) as info:
        parse_backbone_spec("effnet-lite0@imagenet")
    assert "are 'effnet-lite0', without '@'" in str(info.value)
    assert "timm:" not in str(info.value)


@pytest.mark.parametrize("spec", ["keras:resnet18", "resnet18", "timm", "timm@random", "tim:"])
def test_a_spec_far_from_any_family_or_naming_no_model_gets_no_guess(spec):
    with pytest.raises(BackboneError) as info:
        parse_backbone_spec(spec)
    assert "Did you mean" not in str(info.value)


@pytest.mark.parametrize(
    "spec", ["timm:resnet18@/nonexistent/w.pth", "open_clip:RN50@/nonexistent/c.pt"]
)
def test_missing_checkpoint_is_a_clear_error(spec):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        create_backbone(spec)


@pytest.mark.parametrize("suffix", [".pt", ".pth", ".bin", ".safetensors", ".pth.tar", ".ckpt"])
@pytest.mark.parametrize("head", ["timm:test_resnet", "open_clip:RN50", "effnet-lite0"])
@pytest.mark.slow
def test_a_bare_name_with_a_checkpoint_suffix_is_a_missing_file(
    tmp_path, monkeypatch, head, suffix
):
    # Its suffix says it is a checkpoint (docs/extract.md): a missing file, not an unknown
    # pretrained tag nor weights that are no file.
    monkeypatch.chdir(tmp_path)
    with pytest.raises(FileNotFoundError, match=f"'w{re.escape(suffix)}' .* does not exist"):
        create_backbone(f"{head}@w{suffix}")


@pytest.mark.parametrize(
    "make, what",
    [
        (lambda path: None, "does not exist; pass the path of a local checkpoint file"),
        (
            lambda path: path.mkdir(),
            "is a folder, not a checkpoint file; pass the path of the checkpoint file in it",
        ),
        (
            lambda path: path.symlink_to(path.parent / "moved.pth"),
            "is a symbolic link to '{parent}/moved.pth', which does not exist; pass the path "
            "of a local checkpoint file",
        ),
        (  # a chain of links is named by its end, not by the link in between
            lambda path: (
                (path.parent / "link.pth").symlink_to("gone.pth") or path.symlink_to("link.pth")
            ),
            "is a symbolic link to '{parent}/gone.pth', which does not exist; pass the path "
            "of a local checkpoint file",
        ),
        (
            lambda path: os.mkfifo(path),
            "is not a regular file; pass the path of a local checkpoint file",
        ),
    ],
    ids=["missing", "folder", "broken-link", "chain-of-links", "fifo"],
)
@pytest.mark.parametrize("spec", ["timm:test_resnet@{path}", "open_clip:RN50@{path}"])
def test_a_checkpoint_that_is_no_file_is_said_to_be_what_it_is(tmp_path, make, what, spec):
    # A folder, a broken symbolic link and a FIFO were each said not to exist.
    path = tmp_path / "ckpt.pth"
    make(path)
    spec = spec.format(path=path)
    message = f"The checkpoint {str(path)!r} of backbone {spec!r} {what.format(parent=tmp_path)}."
    with pytest.raises(FileNotFoundError, match=f"^{re.escape(message)}$"):
        create_backbone(spec)


@pytest.mark.parametrize(
    "spec, dim, channels_last",
    [("timm:test_resnet@random", 96, True), ("timm:test_vit@random", 64, False)],
)
def test_timm_random_backbone(spec, dim, channels_last):
    bb = create_backbone(spec, image_size=32)
    assert (bb.dim, bb.channels_last) == (dim, channels_last)
    assert bb.weights_id.startswith("random-init:seed0 params-sha256:")
    assert bb.preprocess["crop"] == [32, 32]
    conv = next(m for m in bb.model.modules() if isinstance(m, torch.nn.Conv2d))
    assert conv.weight.is_contiguous(memory_format=torch.channels_last) == channels_last
    assert not bb.model.training and not any(p.requires_grad for p in bb.model.parameters())
    x = torch.rand(3, 3, 32, 32)
    with torch.inference_mode():
        assert bb.model(x).shape == (3, dim)
    # Seeded initialisation: the same spec gives the same weights (resume depends on it).
    again = create_backbone(spec, image_size=32)
    with torch.inference_mode():
        torch.testing.assert_close(bb.model(x), again.model(x))
    assert again.weights_id == bb.weights_id


@pytest.mark.parametrize("image_size", [0, -1, True, 2.5, "32"])
def test_an_image_size_that_is_no_positive_int_is_refused(image_size):
    # 0 was taken as no override (the model's own 160 px) and True as 1 pixel; 2.5 and
    # "32" failed inside timm in a bare AssertionError; -1 was blamed on the model.
    with pytest.raises(ValueError, match=r"The 'image_size' parameter must be an int >= 1"):
        create_backbone("timm:test_resnet@random", image_size=image_size)


@pytest.mark.parametrize("spec", ["timm:test_resnet@random", "timm:test_vit@random"])
def test_an_image_size_of_numpy_s_integers_is_taken(spec):
    # np.int64(32) failed inside timm (an AssertionError, or a TypeError for the ViT).
    bb = create_backbone(spec, image_size=np.int64(32))
    assert bb.preprocess["crop"] == [32, 32]


def test_random_weights_of_another_initialisation_are_recorded_apart(monkeypatch):
    # Random weights were recorded as "random-init:seed0" alone: a release of timm that
    # initialises the model otherwise (here: one more draw before it) made other weights
    # under the same record, and their stores were reused, resumed and compared as one.
    import timm

    spec = "timm:test_resnet@random"
    before = create_backbone(spec, image_size=32).weights_id
    create_model = timm.create_model

    def another_release(*args, **kwargs):
        torch.rand(1)
        return create_model(*args, **kwargs)

    monkeypatch.setattr(timm, "create_model", another_release)
    after = create_backbone(spec, image_size=32).weights_id
    assert after != before and after.split()[0] == before.split()[0] == "random-init:seed0"


def test_random_init_leaves_global_rng_alone():
    torch.manual_seed(123)
    expected = torch.rand(3)
    torch.manual_seed(123)
    create_backbone("timm:test_resnet@random", image_size=32)
    assert torch.equal(torch.rand(3), expected)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float16, torch.bfloat16])
def test_a_model_is_built_in_float32_under_another_default_dtype(tmp_path, dtype):
    # Under torch.set_default_dtype(torch.float64) a random model drew other weights (another
    # weights_id) and extracted in float64 (features 0.17 off); under float16 in half
    # precision, while the store's provenance said float32.
    from extract import extract_features, load_features
    from extract._testing import make_image_folder

    spec = "timm:test_resnet@random"
    folder = make_image_folder(tmp_path / "images", ("cat", "dog"), n_per_class=2, special=False)
    options = dict(batch_size=4, num_workers=0, image_size=32, progress=False, device="cpu")
    expected = create_backbone(spec, image_size=32)
    for decode in ("auto", "tensor"):
        extract_features(folder, spec, tmp_path / f"expected-{decode}.h5", decode=decode, **options)
    torch.set_default_dtype(dtype)
    try:
        bb = create_backbone(spec, image_size=32)
        assert torch.get_default_dtype() == dtype  # the caller's, put back
        # (decode="tensor": a batch of decoded JPEGs and the transform's other images)
        for decode in ("auto", "tensor"):
            extract_features(folder, spec, tmp_path / f"{decode}.h5", decode=decode, **options)
    finally:
        torch.set_default_dtype(torch.float32)
    assert {p.dtype for p in bb.model.parameters()} == {torch.float32}
    assert bb.weights_id == expected.weights_id
    # (the transform's tensors were recorded as 'tensor([0.5000, ...], dtype=torch.float32)'
    # under another default dtype: a store was refused on resuming)
    assert bb.preprocess == expected.preprocess
    for decode in ("auto", "tensor"):  # (under float16 the pixels were rounded to it)
        got = load_features(tmp_path / f"{decode}.h5", in_memory=True).features
        want = load_features(tmp_path / f"expected-{decode}.h5", in_memory=True).features
        np.testing.assert_array_equal(got, want)


def test_a_model_is_built_and_fed_on_the_cpu_under_another_default_device(tmp_path):
    # Under torch.set_default_device("cuda") a random model drew its weights on the GPU,
    # whose generator is not seeded here, and the loader's base seed, drawn from a CPU
    # generator into a GPU tensor, failed ("meta" stands for CUDA: both failed on it).
    from extract import extract_features, load_features
    from extract._testing import make_image_folder

    spec = "timm:test_resnet@random"
    folder = make_image_folder(tmp_path / "images", ("cat", "dog"), n_per_class=2, special=False)
    options = dict(batch_size=4, num_workers=0, image_size=32, progress=False, device="cpu")
    expected = create_backbone(spec, image_size=32)
    extract_features(folder, spec, tmp_path / "expected.h5", **options)
    torch.set_default_device("meta")
    try:
        bb = create_backbone(spec, image_size=32)
        extract_features(folder, spec, tmp_path / "meta.h5", **options)
    finally:
        torch.set_default_device(None)
    assert bb.weights_id == expected.weights_id
    got = load_features(tmp_path / "meta.h5", in_memory=True).features
    np.testing.assert_array_equal(got, load_features(tmp_path / "expected.h5").features[:])


@pytest.mark.parametrize("options", [dict(precision=2), dict(sci_mode=True), dict(profile="short")])
def test_the_recorded_transform_does_not_depend_on_torchs_print_options(options):
    # Under torch.set_printoptions(precision=2) timm's Normalize was recorded as
    # 'tensor([0.50, ...' (the default's 'tensor([0.5000, ...'): a store made in another
    # session was refused on resuming, for a preprocessing that differed in its repr alone.
    expected = create_backbone("timm:test_resnet@random", image_size=32).preprocess
    torch.set_printoptions(**options)
    try:
        got = create_backbone("timm:test_resnet@random", image_size=32).preprocess
        assert repr(torch.tensor([0.5])) != "tensor([0.5000])"  # the caller's, put back
    finally:
        torch.set_printoptions(profile="default")
    assert "tensor([0.5000, 0.5000, 0.5000])" in got["transform"]
    assert got == expected


def _save_timm_checkpoint(path, name, seed):
    import timm

    torch.manual_seed(seed)
    model = timm.create_model(name, num_classes=5).eval()
    torch.save({"state_dict": model.state_dict()}, path)
    return model


def test_a_timm_checkpoint_with_a_decoder_and_a_head_is_taken(tmp_path):
    # An MAE pretraining checkpoint holds its decoder, a classifier checkpoint its head:
    # weights the headless model leaves out, not a deeper model's.
    import timm

    weights = timm.create_model("test_vit", num_classes=5).state_dict()
    extra = {"mask_token": torch.zeros(1, 1, 8), "decoder_blocks.0.mlp.fc1.weight": torch.zeros(2)}
    torch.save({"model": weights | extra}, tmp_path / "w.pth")
    bb = create_backbone(f"timm:test_vit@{tmp_path / 'w.pth'}", image_size=32)
    assert bb.weights_id == file_sha256(tmp_path / "w.pth")


def _non_persistent_buffers(model) -> dict:
    return {
        f"{prefix}.{name}": buffer
        for prefix, module in model.named_modules()
        for name, buffer in module._buffers.items()
        if name in module._non_persistent_buffers_set
    }


@pytest.mark.parametrize(
    "name, extra",
    [
        # DINO's projection head, where the headless model's head is an Identity.
        ("test_vit", lambda model: {"head.mlp.0.weight": torch.zeros(4, 8)}),
        # Relative position indexes, which timm keeps out of the state dict (non-persistent
        # buffers) and other code saved with it.
        ("test_coatnet", _non_persistent_buffers),
    ],
    ids=["projection-head", "non-persistent-buffers"],
)
def test_a_timm_checkpoint_s_keys_in_layers_without_weights_are_taken(tmp_path, name, extra):
    # Keys in places of the model that hold no weight of it are no deeper model's weights.
    import timm

    if not timm.list_models(name):  # timm 1.0.21 has no test_coatnet: a small CoAtNet
        name = "coatnet_nano_rw_224"
    model = timm.create_model(name, num_classes=5)
    torch.save(model.state_dict() | extra(model), tmp_path / "w.pth")
    bb = create_backbone(f"timm:{name}@{tmp_path / 'w.pth'}")
    assert bb.weights_id == file_sha256(tmp_path / "w.pth")


@pytest.mark.parametrize("image_size", [None, 48])
@pytest.mark.parametrize(
    "spec", ["timm:test_resnet", "effnet-lite0", "moco:test_resnet", "open_clip"]
)
def test_the_recorded_preprocessing_is_the_transform_s(tmp_path, spec, image_size):
    # What the store records (and the tensor decoding path applies) is what the library's
    # own eval transform does: its resize, crop, interpolation, mean and std.
    import timm

    if spec.startswith("moco:"):
        torch.save(timm.create_model("test_resnet", num_classes=0).state_dict(), tmp_path / "m.pth")
        spec = f"{spec}@{tmp_path / 'm.pth'}"
    elif spec == "open_clip":
        spec = f"open_clip:{register_tiny_open_clip(tmp_path)}@random"
    else:
        spec += "@random"
    bb = create_backbone(spec, image_size=image_size)
    steps = {type(step).__name__: step for step in bb.transform.transforms}
    resize, crop, normalize = steps["Resize"], steps["CenterCrop"], steps["Normalize"]
    assert bb.preprocess["resize"] == resize.size
    assert bb.preprocess["crop"] == list(crop.size)
    assert bb.preprocess["interpolation"] == resize.interpolation.value
    np.testing.assert_allclose(bb.preprocess["mean"], np.asarray(normalize.mean), rtol=1e-6)
    np.testing.assert_allclose(bb.preprocess["std"], np.asarray(normalize.std), rtol=1e-6)
    if spec.startswith("moco:"):  # MoCo's published evaluation: bilinear, 224 of 256
        assert bb.preprocess["interpolation"] == "bilinear"
        assert create_backbone(spec, image_size=224).preprocess["resize"] == 256
    if spec.startswith("effnet-lite0"):
        assert bb.preprocess["mean"] == bb.preprocess["std"] == [0.5] * 3


def test_timm_local_checkpoint(tmp_path):
    path = tmp_path / "w.pth"
    reference = _save_timm_checkpoint(path, "test_resnet", seed=7)
    bb = create_backbone(f"timm:test_resnet@{path}", image_size=32)
    assert bb.weights_id == file_sha256(path)
    x = torch.rand(2, 3, 32, 32)
    with torch.inference_mode():
        # Weights loaded, classifier dropped: the embedding is the reference's pre-logits.
        expected = reference.forward_head(reference.forward_features(x), pre_logits=True)
        torch.testing.assert_close(bb.model(x), expected)


@pytest.mark.parametrize("name", ["ckpt", "ckpt.h5"])
def test_an_existing_checkpoint_is_taken_whatever_its_name(tmp_path, monkeypatch, name):
    # A file in the working folder with no '/' and no checkpoint suffix was refused as "not
    # a local checkpoint file"; the docs say timm takes 'random' or a local file after '@'.
    monkeypatch.chdir(tmp_path)
    reference = _save_timm_checkpoint(tmp_path / name, "test_resnet", seed=7)
    assert parse_backbone_spec(f"timm:test_resnet@{name}").weights == name
    bb = create_backbone(f"timm:test_resnet@{name}", image_size=32)
    assert bb.weights_id == file_sha256(tmp_path / name)
    x = torch.rand(2, 3, 32, 32)
    with torch.inference_mode():
        expected = reference.forward_head(reference.forward_features(x), pre_logits=True)
        torch.testing.assert_close(bb.model(x), expected)
    # A name that is no file is still refused, and MoCo takes such a file too.
    with pytest.raises(ValueError, match="must be 'random' or a local checkpoint file"):
        parse_backbone_spec("timm:test_resnet@other")
    assert parse_backbone_spec(f"moco:{name}").weights == name


@pytest.mark.parametrize(
    "spec, weights",
    [("timm:test_resnet@~/w.pth", "w.pth"), ("moco:~/m/w.pth.tar", "m/w.pth.tar"),
     ("moco:resnet50@~/w.pth", "w.pth"), ("effnet-lite0@~/w.pth", "w.pth"),
     ("open_clip:RN50@~/c/w", "c/w"), ("timm:hf-hub:org/x@~/w.pth", "w.pth")],
)  # fmt: skip
def test_a_checkpoint_in_the_home_folder_is_read_as_a_source_there_is(
    tmp_path, monkeypatch, spec, weights
):
    # A shell leaves a ~ after '@' as it is: 'timm:test_resnet@~/ckpt.pth' was refused as
    # "The checkpoint '~/ckpt.pth' ... does not exist", while '~/photos' is the home folder.
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.chdir(tmp_path)
    assert parse_backbone_spec(spec).weights == str(tmp_path / "home" / weights)
    if spec.startswith("timm:test_resnet"):
        (tmp_path / "home").mkdir()
        reference = _save_timm_checkpoint(tmp_path / "home/w.pth", "test_resnet", seed=7)
        bb = create_backbone(spec, image_size=32)
        assert bb.weights_id == file_sha256(tmp_path / "home/w.pth")
        x = torch.rand(2, 3, 32, 32)
        with torch.inference_mode():
            expected = reference.forward_head(reference.forward_features(x), pre_logits=True)
            torch.testing.assert_close(bb.model(x), expected)
    (tmp_path / "~").mkdir()  # (a folder named ~ here is that folder)
    assert parse_backbone_spec(spec).weights == "~/" + weights


@pytest.mark.parametrize(
    "state",
    [
        {"foo.weight": torch.zeros(3)},  # another model's weights altogether
        "moco",  # a MoCo checkpoint's keys (module.encoder_q.*) given to timm:
        "no_norm",  # a ViT checkpoint without its final norm
        "deeper",  # a deeper model's: more blocks in a stage than the model has
    ],
)
def test_a_timm_checkpoint_that_does_not_fit_is_refused(tmp_path, state):
    # timm loads a headless model non-strictly: these loaded nothing, or left the norm at
    # its initialisation, and the features were recorded as the checkpoint's.
    import timm

    from extract import BackboneError

    name = "test_resnet"
    if state == "moco":
        weights = timm.create_model(name, num_classes=5).state_dict()
        state = {"state_dict": {f"module.encoder_q.{k}": v for k, v in weights.items()}}
    elif state == "no_norm":
        name = "test_vit"
        weights = timm.create_model(name, num_classes=5).state_dict()
        state = {k: v for k, v in weights.items() if not k.startswith("norm.")}
    elif state == "deeper":  # resnet34's layer1.2.* given to resnet18 loaded the rest
        weights = timm.create_model(name, num_classes=5).state_dict()
        block = [k for k in weights if k.startswith("layer1.0.")]
        state = weights | {k.replace("layer1.0.", "layer1.7."): weights[k] for k in block}
    torch.save(state, tmp_path / "w.pth")
    with pytest.raises(BackboneError, match="does not fit the timm model"):
        create_backbone(f"timm:{name}@{tmp_path / 'w.pth'}", image_size=32)


def test_a_timm_vit_of_another_input_size(tmp_path):
    # Built at its own 224 × 224, vit_tiny refused 160 × 160 inputs (a raw AssertionError):
    # timm now builds it at the size asked, its position embeddings resampled on loading.
    import timm

    torch.manual_seed(0)
    model = timm.create_model("vit_tiny_patch16_224", num_classes=0)
    torch.save(model.state_dict(), tmp_path / "vit.pth")
    bb = create_backbone(f"timm:vit_tiny_patch16_224@{tmp_path / 'vit.pth'}", image_size=160)
    assert bb.preprocess["crop"] == [160, 160] and bb.dim == 192
    with torch.inference_mode():
        assert bb.model(torch.rand(1, 3, 160, 160)).shape == (1, 192)


def test_a_checkpoint_file_is_never_read_as_the_registry_s_own_format(tmp_path, monkeypatch):
    # vit_tiny's registry weights are JAX .npz files (custom_load): timm before 1.0.31 read
    # a PyTorch file given for it with its .npz reader, which refused it, so every
    # timm:vit_...@file.pth failed there (seen with timm 1.0.29). 1.0.31 resets custom_load
    # itself when a file is given; the overlay now says so for every version.
    import timm

    asked = []
    create_model = timm.create_model

    def spy(name, *args, **kwargs):
        asked.append(kwargs.get("pretrained_cfg_overlay"))
        return create_model(name, *args, **kwargs)

    monkeypatch.setattr(timm, "create_model", spy)
    torch.save(create_model("vit_tiny_patch16_224", num_classes=0).state_dict(), tmp_path / "v.pth")
    create_backbone(f"timm:vit_tiny_patch16_224@{tmp_path / 'v.pth'}")
    assert asked == [{"file": str(tmp_path / "v.pth"), "custom_load": False}]


def test_an_open_clip_coca_model_embeds_as_its_encode_image(tmp_path):
    # CoCa's vision tower returns (pooled, tokens): building the backbone crashed.
    import open_clip

    text = {"context_length": 8, "vocab_size": 100, "width": 32, "heads": 2, "layers": 1}
    cfg = {
        "embed_dim": 32,
        "vision_cfg": {
            "image_size": 32, "layers": 1, "width": 32, "patch_size": 8, "head_width": 16,
            "attentional_pool": True, "attn_pooler_heads": 2, "output_tokens": True,
        },
        "text_cfg": text | {"embed_cls": True, "output_tokens": True},
        "multimodal_cfg": text | {"attn_pooler_heads": 2},
        "custom_text": True,
    }  # fmt: skip
    (tmp_path / "coca_tiny_test.json").write_text(json.dumps(cfg))
    open_clip.add_model_config(tmp_path / "coca_tiny_test.json")
    torch.manual_seed(0)
    model, _, _ = open_clip.create_model_and_transforms("coca_tiny_test", pretrained=None)
    torch.save(model.state_dict(), tmp_path / "coca.pt")
    bb = create_backbone(f"open_clip:coca_tiny_test@{tmp_path / 'coca.pt'}")
    x = torch.rand(2, 3, 32, 32)
    with torch.inference_mode():  # unnormalised, as every open_clip backbone's embedding
        expected = model.eval().encode_image(x, normalize=False)
        torch.testing.assert_close(bb.model(x), expected)
    assert bb.dim == 32


def test_the_tags_warning_names_each_distinct_preprocessing_with_its_tags(monkeypatch, caplog):
    # It showed the first three tags, which agreed (ViT-L-14: openai, laion400m_e31 and
    # laion400m_e32), and never the one that differs (laion2b_s32b_b82k, mean = std = 0.5).
    import open_clip

    from extract._backbones import _tags_preprocess

    openai, half = (
        {"mean": (0.48,) * 3, "std": (0.27,) * 3},
        {"mean": (0.5,) * 3, "std": (0.5,) * 3},
    )
    tags = {"a": openai, "b": openai, "c": openai, "d": openai, "e": openai, "odd": half}
    monkeypatch.setattr(open_clip, "list_pretrained_tags_by_model", lambda model: list(tags))
    monkeypatch.setattr(open_clip, "get_pretrained_cfg", lambda model, tag: tags[tag])
    with caplog.at_level(logging.WARNING, logger="extract"):
        assert _tags_preprocess("ViT-X") == {}
    (message,) = [r.getMessage() for r in caplog.records]
    assert (
        "(a, b, c and 2 more: {'mean': (0.48, 0.48, 0.48), 'std': (0.27, 0.27, 0.27)}; " in message
    )
    assert "; odd: {'mean': (0.5, 0.5, 0.5), 'std': (0.5, 0.5, 0.5)})" in message


@pytest.mark.parametrize("agree", [True, False])
def test_a_local_open_clip_checkpoint_takes_its_tags_preprocessing(
    tmp_path, monkeypatch, caplog, agree
):
    # open_clip applies a tag's preprocessing (SigLIP: mean = std = 0.5, squashed resize)
    # only when loading by the tag: a local checkpoint of the model got OpenAI's.
    import open_clip

    name = register_tiny_open_clip(tmp_path)
    siglip = {"mean": (0.5,) * 3, "std": (0.5,) * 3, "resize_mode": "squash"}
    tags = {"webli": siglip, "other": siglip if agree else {"mean": (0.0,) * 3}}
    lookup, listing = open_clip.get_pretrained_cfg, open_clip.list_pretrained_tags_by_model
    monkeypatch.setattr(
        open_clip,
        "get_pretrained_cfg",
        lambda model, tag: tags[tag] if model == name and tag in tags else lookup(model, tag),
    )
    monkeypatch.setattr(
        open_clip,
        "list_pretrained_tags_by_model",
        lambda model: list(tags) if model == name else listing(model),
    )
    model, _, _ = open_clip.create_model_and_transforms(name, pretrained=None)
    torch.save(model.state_dict(), tmp_path / "clip.pt")
    bb = create_backbone(f"open_clip:{name}@{tmp_path / 'clip.pt'}")
    if agree:
        assert bb.preprocess["mean"] == [0.5] * 3 and bb.preprocess["mode"] == "squash"
    else:  # the tags disagree: open_clip's default, which the store records
        assert bb.preprocess["mean"] == list(open_clip.OPENAI_DATASET_MEAN)
    assert ("preprocess differently" in caplog.text) == (not agree)  # a warning says so


def test_an_open_clip_checkpoint_that_fits_only_at_its_own_size_says_so(tmp_path):
    # A ResNet tower's attention pool keeps its position embedding at the model's size: at
    # --image-size the checkpoint was said not to fit the model ("pass a state_dict of the
    # whole model"), when it was the model's own.
    import open_clip

    from extract import BackboneError

    cfg = {
        "embed_dim": 16,
        "vision_cfg": {"image_size": 64, "layers": [1, 1, 1, 1], "width": 8, "head_width": 8},
        "text_cfg": {"context_length": 8, "vocab_size": 100, "width": 16, "heads": 2, "layers": 1},
    }
    (tmp_path / "rn_tiny_test.json").write_text(json.dumps(cfg))
    open_clip.add_model_config(tmp_path / "rn_tiny_test.json")
    model, _, _ = open_clip.create_model_and_transforms("rn_tiny_test", pretrained=None)
    torch.save(model.state_dict(), tmp_path / "rn.pt")
    spec = f"open_clip:rn_tiny_test@{tmp_path / 'rn.pt'}"
    assert create_backbone(spec).preprocess["crop"] == [64, 64]
    with pytest.raises(
        BackboneError,
        match=r"fits the open_clip model 'rn_tiny_test' at its own input size, but not at "
        r"image_size=128 .*attnpool\.positional_embedding.*Drop --image-size",
    ):
        create_backbone(spec, image_size=128)


@pytest.mark.slow
@pytest.mark.parametrize("name, works", [("crossvit_tiny_240", True), ("cait_xxs24_224", False)])
def test_a_timm_checkpoint_timm_cannot_resize(tmp_path, name, works):
    # Built at --image-size, their position embeddings do not take the checkpoint's:
    # CrossViT is then built at its own size and rescales its input itself, as before; CaiT
    # takes one input size, and says so in one line.
    import timm

    from extract import BackboneError

    torch.save(timm.create_model(name, num_classes=0).state_dict(), tmp_path / "w.pth")
    spec = f"timm:{name}@{tmp_path / 'w.pth'}"
    if works:
        assert create_backbone(spec, image_size=160).dim == 288
    else:
        with pytest.raises(BackboneError, match="does not take 160 × 160 inputs"):
            create_backbone(spec, image_size=160)


def test_an_input_size_too_large_for_memory_is_no_bad_size(monkeypatch):
    # The CPU allocator's failure at a huge --image-size was said to be a size the backbone
    # does not take; raised as it is, the CLI says the machine ran out of memory.
    from torch import nn

    from extract import BackboneError, _backbones

    message = "DefaultCPUAllocator: can't allocate memory: you tried to allocate 12 bytes."

    class Hungry(nn.Module):
        def forward(self, x):
            raise RuntimeError(message)

    build = _backbones._BUILDERS["timm"]
    monkeypatch.setitem(_backbones._BUILDERS, "timm", lambda *a: (Hungry(), *build(*a)[1:]))
    with pytest.raises(RuntimeError, match=f"^{message}$") as info:
        create_backbone("timm:test_resnet@random", image_size=64)
    assert not isinstance(info.value, BackboneError)


def test_checkpoint_checks_of_two_threads_see_their_own_loads(tmp_path):
    # The recording replaced Module.load_state_dict for the whole process: a thread saw
    # the other's loads (good checkpoints refused, bad ones accepted), and an unlucky
    # order left the method replaced for good.
    import threading

    import timm

    from extract import BackboneError

    weights = timm.create_model("test_vit", num_classes=5).state_dict()
    torch.save(weights, tmp_path / "good.pth")
    torch.save(
        {k: v for k, v in weights.items() if not k.startswith("norm.")}, tmp_path / "bad.pth"
    )
    original = torch.nn.Module.load_state_dict
    outcomes = {"good": [], "bad": []}

    def build(kind):
        for _ in range(6):
            try:
                create_backbone(f"timm:test_vit@{tmp_path / kind}.pth", image_size=32)
                outcomes[kind].append("built")
            except BackboneError:
                outcomes[kind].append("refused")

    threads = [threading.Thread(target=build, args=(kind,)) for kind in outcomes]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert outcomes == {"good": ["built"] * 6, "bad": ["refused"] * 6}
    assert torch.nn.Module.load_state_dict is original


def test_nested_recordings_each_see_the_loads_inside_them():
    from extract._weights import _state_dict_loads

    original = torch.nn.Module.load_state_dict
    layer = torch.nn.Linear(2, 2)
    with _state_dict_loads() as outer:
        layer.load_state_dict(layer.state_dict())
        with _state_dict_loads() as inner:
            layer.load_state_dict(layer.state_dict())
    assert (len(outer), len(inner)) == (2, 1)
    assert torch.nn.Module.load_state_dict is original
    with _state_dict_loads():  # a later recording adds nothing to the finished ones
        layer.load_state_dict(layer.state_dict())
    assert (len(outer), len(inner)) == (2, 1)


def test_a_device_error_while_probing_is_not_blamed_on_the_input_size(monkeypatch):
    def broken(self, x):
        raise RuntimeError("CUDA error: no kernel image is available for execution")

    monkeypatch.setattr(torch.nn.Conv2d, "forward", broken)
    with pytest.raises(RuntimeError, match="CUDA error"):
        create_backbone("timm:test_resnet@random", image_size=64)


@pytest.mark.parametrize("error", [RuntimeError, AssertionError])
def test_a_model_failing_at_its_own_input_size_is_not_told_to_drop_image_size(monkeypatch, error):
    # No --image-size was given: there is none to drop, and the model's error is its own.
    from extract import BackboneError

    def broken(self, x):
        raise error("the model's own failure")

    monkeypatch.setattr(torch.nn.Conv2d, "forward", broken)
    with pytest.raises(error, match="the model's own failure") as info:
        create_backbone("timm:test_resnet@random")
    assert not isinstance(info.value, BackboneError)


def test_older_torch_s_refusal_of_objects_is_recognised(tmp_path, monkeypatch):
    # torch 2.3's wording has no "can still be loaded".
    import pickle

    from extract import BackboneError

    def refuse(*args, **kwargs):
        raise pickle.UnpicklingError(
            "Weights only load failed. Re-running `torch.load` with `weights_only` set to "
            "`False` will likely succeed, but it can result in arbitrary code execution.Do it "
            "only if you get the file from a trusted source. WeightsUnpickler error: "
            "Unsupported class numpy.core.multiarray.scalar"
        )

    (tmp_path / "m.pth").write_bytes(b"x")
    monkeypatch.setattr(torch, "load", refuse)
    with pytest.raises(BackboneError, match="holds objects other than tensors"):
        create_backbone(f"moco:resnet18@{tmp_path / 'm.pth'}")


def test_a_file_that_is_no_checkpoint_is_named_so(tmp_path):
    from extract import BackboneError

    (tmp_path / "moco.pth").write_text("<html>404 Not Found</html>")
    with pytest.raises(BackboneError, match="cannot be read as a PyTorch checkpoint"):
        create_backbone(f"moco:resnet18@{tmp_path / 'moco.pth'}")


def test_open_clip_tiny_random_and_local_checkpoint(tmp_path):
    import open_clip

    name = register_tiny_open_clip(tmp_path)
    bb = create_backbone(f"open_clip:{name}@random")
    assert (bb.dim, bb.preprocess["crop"]) == (32, [32, 32])
    assert bb.weights_id.startswith("random-init:seed0 params-sha256:")
    assert "Normalize" in bb.preprocess["transform"]
    torch.manual_seed(3)
    model, _, _ = open_clip.create_model_and_transforms(name, pretrained=None)
    torch.save(model.state_dict(), tmp_path / "clip.pt")
    loaded = create_backbone(f"open_clip:{name}@{tmp_path / 'clip.pt'}")
    assert loaded.weights_id == file_sha256(tmp_path / "clip.pt")
    x = torch.rand(2, 3, 32, 32)
    with torch.inference_mode():
        torch.testing.assert_close(loaded.model(x), model.eval().encode_image(x))


def test_an_open_clip_checkpoint_that_does_not_fit_is_one_error(tmp_path):
    # The image tower saved alone: open_clip's "Missing key(s)" traceback (exit status 1).
    import open_clip

    from extract import BackboneError

    name = register_tiny_open_clip(tmp_path)
    model, _, _ = open_clip.create_model_and_transforms(name, pretrained=None)
    state = {k: v for k, v in model.state_dict().items() if k.startswith("visual.")}
    torch.save(state, tmp_path / "visual.pt")
    missing = len(model.state_dict()) - len(state)
    with pytest.raises(BackboneError) as caught:
        create_backbone(f"open_clip:{name}@{tmp_path / 'visual.pt'}")
    assert re.fullmatch(
        rf"The checkpoint '.*visual.pt' does not fit the open_clip model '{name}': open_clip "
        rf"builds the model but cannot load the file into it \(RuntimeError: weights "
        rf"{missing} missing \([^,)]+, [^,)]+, [^,)]+, \.\.\.\)\)\. Pass a state_dict of "
        rf"the whole '{name}' model, both towers \(open_clip loads them together\)\.",
        str(caught.value),
    )


@pytest.mark.parametrize(
    "error, said",
    [
        # torch's report of a strict load, with weights of another shape
        (
            RuntimeError(
                "Error(s) in loading state_dict for CLIP:\n\tUnexpected key(s) in state_dict: "
                '"fc.weight". \n\tsize mismatch for visual.proj: copying a param with shape '
                "torch.Size([2]) from checkpoint, the shape in current model is torch.Size([3])."
            ),
            "RuntimeError: weights 1 unexpected (fc.weight); 1 of another shape (visual.proj)",
        ),
        # an assertion of open_clip's resizing (a ResNet's checkpoint given to a ViT)
        (AssertionError("text pos_embed width changed!"), "AssertionError: text pos_embed width"),
        (KeyError("x" * 300), "KeyError: '" + "x" * 199 + "...)"),  # its first 200 characters
    ],
)
def test_a_checkpoint_open_clip_cannot_load_says_why_in_one_line(
    tmp_path, monkeypatch, error, said
):
    import open_clip

    from extract import BackboneError

    spec = _tiny_open_clip_checkpoint(tmp_path)
    create = open_clip.create_model_and_transforms

    def failing_to_load(model_name, pretrained=None, **kwargs):
        if pretrained is not None:
            raise error
        return create(model_name, pretrained=None, **kwargs)

    monkeypatch.setattr(open_clip, "create_model_and_transforms", failing_to_load)
    with pytest.raises(BackboneError, match=re.escape(f"load the file into it ({said}")):
        create_backbone(spec)


def test_an_open_clip_model_that_cannot_be_built_keeps_the_library_s_error(tmp_path, monkeypatch):
    # Only a checkpoint that a buildable model cannot take is blamed on the file.
    import open_clip

    spec = _tiny_open_clip_checkpoint(tmp_path)

    def failing(*args, **kwargs):
        raise RuntimeError("CUDA error: out of memory")

    monkeypatch.setattr(open_clip, "create_model_and_transforms", failing)
    with pytest.raises(RuntimeError, match="CUDA error: out of memory"):
        create_backbone(spec)


def _tiny_open_clip_checkpoint(folder) -> str:
    """The spec of a registered tiny open_clip model at its random weights, saved whole."""
    import open_clip

    name = register_tiny_open_clip(folder)
    model, _, _ = open_clip.create_model_and_transforms(name, pretrained=None)
    torch.save(model.state_dict(), folder / "clip.pt")
    return f"open_clip:{name}@{folder / 'clip.pt'}"


@pytest.mark.slow
@pytest.mark.parametrize(
    "prefix, extra",
    [
        ("module.encoder_q.", {"module.encoder_k.conv1.weight": torch.zeros(1)}),  # MoCo v2
        ("module.base_encoder.", {"module.momentum_encoder.conv1.weight": torch.zeros(1)}),  # v3
    ],
)
def test_moco_checkpoint(tmp_path, prefix, extra):
    import timm

    torch.manual_seed(1)
    resnet = timm.create_model("resnet18", num_classes=0).eval()
    state = {prefix + k: v for k, v in resnet.state_dict().items()}
    state |= {prefix + "fc.0.weight": torch.zeros(4, 512), prefix + "fc.2.bias": torch.zeros(4)}
    state |= extra | {"module.queue": torch.zeros(8, 3)}
    path = tmp_path / "moco.pth.tar"
    torch.save({"epoch": 800, "arch": "resnet18", "state_dict": state}, path)
    assert set(moco_state_dict(torch.load(path, weights_only=True))) == set(resnet.state_dict())
    bb = create_backbone(f"moco:resnet18@{path}", image_size=32)
    assert bb.dim == 512 and bb.preprocess["interpolation"] == "bilinear"
    x = torch.rand(2, 3, 32, 32)
    with torch.inference_mode():
        torch.testing.assert_close(bb.model(x), resnet(x))


@pytest.mark.slow
def test_moco_v3_vit_checkpoint(tmp_path):
    # MoCo v3's ViTs carry their projection MLP as `head` (its linear evaluation drops
    # `head` for ViTs, `fc` for ResNets): every such checkpoint was refused for
    # "Unexpected key(s) head.0.weight ...".
    import timm

    torch.manual_seed(1)
    # MoCo v3's ViT-Small has 12 heads (timm's 6): same shapes, other attention.
    vit = timm.create_model("vit_small_patch16_224", num_classes=0, num_heads=12).eval()
    state = {f"module.base_encoder.{k}": v for k, v in vit.state_dict().items()}
    state |= {f"module.base_encoder.head.{i}.weight": torch.zeros(4, 4) for i in (0, 1, 3)}
    state |= {"module.predictor.0.weight": torch.zeros(4, 4)}
    path = tmp_path / "vit-s-300ep.pth.tar"
    torch.save({"epoch": 300, "state_dict": state}, path)
    bb = create_backbone(f"moco:vit_small_patch16_224@{path}")
    x = torch.rand(2, 3, 224, 224)
    with torch.inference_mode():
        torch.testing.assert_close(bb.model(x), vit(x))
    # At another input size the position embeddings are resampled as timm resamples its
    # own checkpoints' (the same weights loaded through timm): it was refused.
    small = create_backbone(f"moco:vit_small_patch16_224@{path}", image_size=112)
    assert small.preprocess["crop"] == [112, 112]
    torch.save(vit.state_dict(), tmp_path / "plain.pth")
    timm_small = timm.create_model(
        "vit_small_patch16_224", pretrained=True, num_classes=0, num_heads=12, img_size=112,
        pretrained_cfg_overlay=dict(file=str(tmp_path / "plain.pth"), custom_load=False),
    ).eval()  # fmt: skip
    x = torch.rand(2, 3, 112, 112)
    with torch.inference_mode():
        torch.testing.assert_close(small.model(x), timm_small(x))


def test_a_moco_checkpoint_is_not_trusted_to_run_code(tmp_path):
    import argparse

    import timm

    from extract import BackboneError

    state = {
        f"module.encoder_q.{k}": v for k, v in timm.create_model("resnet18").state_dict().items()
    }
    # Any object beyond tensors, numbers and strings would be unpickled by running code.
    torch.save({"state_dict": state, "args": argparse.Namespace(lr=0.03)}, tmp_path / "m.pth")
    with pytest.raises(BackboneError, match="holds objects other than tensors, Python numbers"):
        create_backbone(f"moco:resnet18@{tmp_path / 'm.pth'}")


def test_moco_checkpoint_for_another_arch_is_refused(tmp_path):
    import timm

    state = {
        "module.encoder_q." + k: v for k, v in timm.create_model("test_resnet").state_dict().items()
    }
    torch.save({"state_dict": state}, tmp_path / "m.pth")
    with pytest.raises(ValueError, match="does not match the architecture 'resnet18'"):
        create_backbone(f"moco:resnet18@{tmp_path / 'm.pth'}")


@pytest.mark.parametrize(
    "key, expected",
    [
        ("_conv_stem.weight", "conv_stem.weight"),
        ("_bn0.running_mean", "bn1.running_mean"),
        ("_blocks.0._depthwise_conv.weight", "blocks.0.0.conv_dw.weight"),
        ("_blocks.0._project_conv.weight", "blocks.0.0.conv_pw.weight"),
        ("_blocks.0._bn2.bias", "blocks.0.0.bn2.bias"),
        ("_blocks.1._expand_conv.weight", "blocks.1.0.conv_pw.weight"),
        ("_blocks.2._bn0.weight", "blocks.1.1.bn1.weight"),
        ("_blocks.15._project_conv.weight", "blocks.6.0.conv_pwl.weight"),
        ("_blocks.14._bn2.bias", "blocks.5.3.bn3.bias"),
        ("_conv_head.weight", "conv_head.weight"),
        ("_bn1.weight", "bn2.weight"),
        ("_fc.bias", "classifier.bias"),
    ],
)
def test_lite0_key_mapping(key, expected):
    assert lite0_key(key) == expected


def test_spec_objects_pass_through():
    spec = BackboneSpec("timm", "test_resnet")
    assert parse_backbone_spec(spec) is spec
    assert {spec: "built"}[BackboneSpec("timm", "test_resnet")] == "built"  # a value, hashable
    assert str(spec) == "timm:test_resnet"


@pytest.mark.parametrize(
    "spec, match",
    [
        ("timm:resnet1800@random", r"timm has no model 'resnet1800'.*did you mean 'resnet18'"),
        ("timm:resnet18.in1k_foo", r"no pretrained tag 'in1k_foo' for 'resnet18'.*did you mean"),
        ("moco:resnet1800@/w/m.pth", r"timm has no model 'resnet1800'.*did you mean"),
        ("open_clip:ViT-B-31@random", r"open_clip has no model 'ViT-B-31'.*did you mean 'ViT-B-3"),
        (
            "open_clip:RN50@open-ai",
            r"no pretrained tag 'open-ai' for 'RN50'.*did you mean 'openai'\? Random weights "
            r"\(open_clip's pretrained=None\) are 'open_clip:RN50@random'\.$",
        ),
        # open_clip's pretrained=None, spelt as a tag: the spelling of random weights named.
        (
            "open_clip:ViT-S-32@None",
            r"no pretrained tag 'None' for 'ViT-S-32'.*; open_clip lists no pretrained tags "
            r"for it\. Random weights .* are 'open_clip:ViT-S-32@random'\.$",
        ),
    ],
)
def test_unknown_model_or_tag_names_the_closest(spec, match):
    from extract import BackboneError

    with pytest.raises(BackboneError, match=match) as info:
        create_backbone(spec)
    # A short suggestion, not the registry: timm alone has over a thousand names.
    assert len(str(info.value)) < 300 and "\n" not in str(info.value)


@pytest.fixture
def no_network(tmp_path):
    """No reachable hub and empty caches: nothing can be downloaded or found."""
    from extract._testing import no_weights_hub

    with no_weights_hub(tmp_path / "cache"):
        yield tmp_path / "cache" / "huggingface"


def test_timm_default_is_pretrained_and_offline_is_one_clear_error(no_network, capfd):
    from extract import WeightsUnavailableError

    with pytest.raises(WeightsUnavailableError) as info:
        create_backbone("timm:test_resnet")
    message = str(info.value)
    assert "'timm:test_resnet' (timm/test_resnet.r160_in1k) could not be loaded" in message
    assert "timm:test_resnet@/path/to/checkpoint.pth" in message
    assert "timm:test_resnet@random" in message and "\n" not in message
    assert "Retrying" not in capfd.readouterr().err


@pytest.mark.slow
@pytest.mark.parametrize("weights", ["random", "/w.pth"])
@pytest.mark.parametrize("source", ["hf-hub:nobody/clip", "local-dir:/models/clip"])
def test_open_clip_hub_and_folder_models_take_no_other_weights(source, weights):
    # open_clip loads such a model's weights with its config: unlike timm, no '@random'
    # either, which the refusal said nothing of (timm's names it as the way out).
    pytest.importorskip("open_clip")
    from extract import BackboneError

    with pytest.raises(BackboneError) as info:
        create_backbone(f"open_clip:{source}@{weights}")
    assert str(info.value) == (
        f"The open_clip model {source!r} brings its own weights, which open_clip loads "
        f"with its config, so it has no '@random' either; drop '@{weights}'."
    )


def _into_hub_cache(folder, cache, repo: str) -> None:
    """Put a model ``folder`` in the Hugging Face ``cache`` as the main revision of ``repo``."""
    snapshot = cache / f"models--{repo.replace('/', '--')}" / "snapshots" / ("0" * 40)
    shutil.copytree(folder, snapshot)
    (snapshot.parents[1] / "refs").mkdir()
    (snapshot.parents[1] / "refs" / "main").write_text("0" * 40)


@pytest.mark.parametrize("family", ["timm", "open_clip"])
def test_a_model_folder_in_the_home_folder_is_read_as_a_checkpoint_there_is(
    tmp_path, monkeypatch, family
):
    # 'timm:local-dir:~/saved' was "The timm model folder '~/saved' ... holds no
    # config.json" (a shell leaves that ~ as it is, as timm and open_clip do), while
    # '@~/ckpt.pth' is in the home folder.
    from timm.models import save_for_hf

    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.chdir(tmp_path)
    spec = parse_backbone_spec(f"{family}:local-dir:~/saved@random")
    assert spec.model == f"local-dir:{tmp_path / 'saved'}" and spec.weights == "random"
    if family == "timm":
        import timm

        reference = timm.create_model("test_resnet", num_classes=0).eval()
        save_for_hf(reference, tmp_path / "saved")
        bb = create_backbone("timm:local-dir:~/saved", image_size=32)
        x = torch.rand(2, 3, 32, 32)
        with torch.inference_mode():
            torch.testing.assert_close(bb.model(x), reference(x))


def test_timm_hub_and_folder_names_are_built_as_timm_builds_them(no_network, tmp_path):
    # timm's 'hf-hub:' and 'local-dir:' names were refused ("timm has no model").
    import timm
    from timm.models import save_for_hf

    from extract import BackboneError, WeightsUnavailableError

    torch.manual_seed(3)
    reference = timm.create_model("test_resnet", num_classes=0).eval()
    folder = tmp_path / "saved@2"  # its '@' is the path's, not a weights part
    save_for_hf(reference, folder)
    bb = create_backbone(f"timm:local-dir:{folder}", image_size=32)
    assert re.fullmatch(
        rf"tag:local-dir:{re.escape(str(folder))} params-sha256:\w{{64}}", bb.weights_id
    )
    x = torch.rand(2, 3, 32, 32)
    with torch.inference_mode():
        torch.testing.assert_close(bb.model(x), reference(x))
    assert bb.preprocess["crop"] == [32, 32]
    random = create_backbone(f"timm:local-dir:{folder}@random", image_size=32)
    assert random.weights_id.startswith("random-init:seed0 params-sha256:")
    assert random.weights_id.split(":")[-1] != bb.weights_id.split(":")[-1]  # not the folder's
    with pytest.raises(BackboneError, match="brings its own weights; drop '@/w.pth'"):
        create_backbone(f"timm:local-dir:{folder}@/w.pth")
    # A missing folder is said to be missing ("holds no config.json" before), a file no folder.
    with pytest.raises(BackboneError, match=r"/nothing' of backbone .* does not exist; timm's"):
        create_backbone(f"timm:local-dir:{tmp_path / 'nothing'}")
    with pytest.raises(BackboneError, match="config.json' of backbone .* is no folder; timm's"):
        create_backbone(f"timm:local-dir:{folder / 'config.json'}")
    with pytest.raises(BackboneError, match="holds no config.json"):
        create_backbone(f"timm:local-dir:{tmp_path}")
    # A folder with its config but no weights (half copied): timm's traceback before.
    half = tmp_path / "half"
    half.mkdir()
    (half / "config.json").write_bytes((folder / "config.json").read_bytes())
    with pytest.raises(BackboneError, match="holds no weights file"):
        create_backbone(f"timm:local-dir:{half}")
    create_backbone(f"timm:local-dir:{half}@random", image_size=32)  # its config alone
    # Offline, a hub name is one clear error, with no checkpoint to offer in its place...
    hub = "hf-hub:nobody/saved-resnet"
    with pytest.raises(WeightsUnavailableError, match="could not be loaded") as info:
        create_backbone(f"timm:{hub}")
    assert "@/path/to/checkpoint" not in str(info.value)
    assert str(info.value).endswith(
        "or pass the folder that timm's save_for_hf writes of the model: "
        "'timm:local-dir:/path/to/folder'."
    )
    with pytest.raises(WeightsUnavailableError, match="The config of 'timm:hf-hub:.*@random'"):
        create_backbone(f"timm:{hub}@random")
    # ... and one in the hub's cache is read from it.
    _into_hub_cache(folder, no_network, "nobody/saved-resnet")
    cached = create_backbone(f"timm:{hub}", image_size=32)
    assert cached.weights_id == bb.weights_id.replace(f"local-dir:{folder}", hub)


def test_a_model_folder_whose_weights_do_not_fit_is_one_error(tmp_path):
    # Weights of another architecture than the folder's config.json names ended in a
    # 100-line traceback of timm's load (exit status 1), and a folder saved with its
    # classifier, loaded headless (leniently) without a parameter, kept it random.
    import timm
    from timm.models import save_for_hf

    from extract import BackboneError

    torch.manual_seed(3)
    reference = timm.create_model("test_resnet", num_classes=10)
    weights = reference.state_dict()
    for name, state, match in [
        ("other", timm.create_model("resnet10t").state_dict(), "size mismatch for"),
        ("extra", {**weights, "layer1.9.weight": torch.zeros(1)},
         r"1 of its weights belong inside the model's layers but have no place there"),
        ("short", {k: v for k, v in weights.items() if k != "layer1.0.conv1.weight"},
         r"1 of its parameters are not in it \(layer1\.0\.conv1\.weight\)"),
    ]:  # fmt: skip
        folder = tmp_path / name
        save_for_hf(reference, folder)
        torch.save(state, folder / "pytorch_model.bin")
        with pytest.raises(BackboneError, match=match) as info:
            create_backbone(f"timm:local-dir:{folder}", image_size=32)
        assert str(info.value).startswith(f"The checkpoint of backbone 'timm:local-dir:{folder}'")
        assert str(info.value).endswith("Its config.json must name the architecture its "
                                        "weights were trained as.")  # fmt: skip
        assert "\n" not in str(info.value)


@pytest.mark.parametrize(
    "config, match",
    [
        (b"{not json", r"has a config.json that cannot be read as JSON \(Expecting property"),
        (b"\xff\xfe{", "has a config.json that cannot be read as JSON"),
        (b"[1]", "has a config.json without an 'architecture' name"),
        (b'{"num_classes": 0}', "has a config.json without an 'architecture' name"),
        (b'{"architecture": "test_resnt"}',
         "names an architecture timm does not have, 'test_resnt'; did you mean 'test_resnet'"),
    ],
)  # fmt: skip
def test_a_model_folder_whose_config_timm_cannot_read_is_one_error(tmp_path, config, match):
    # timm's KeyError ('architecture'), JSONDecodeError or "Unknown model" traceback.
    from extract import BackboneError

    (tmp_path / "config.json").write_bytes(config)
    with pytest.raises(BackboneError, match=match) as info:
        create_backbone(f"timm:local-dir:{tmp_path}", image_size=32)
    assert str(info.value).startswith(f"The timm model folder {str(tmp_path)!r} of backbone")


def test_a_model_folder_whose_config_names_another_architecture_is_one_error(tmp_path):
    # A resnet's folder whose config.json names a ViT: timm looks up the resnet's first
    # convolution (the config's first_conv) in the ViT, and its AttributeError ended the run.
    import timm
    from timm.models import save_for_hf

    from extract import BackboneError

    save_for_hf(timm.create_model("test_resnet", num_classes=0), tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**config, "architecture": "test_vit"}))
    with pytest.raises(BackboneError) as info:
        create_backbone(f"timm:local-dir:{tmp_path}", image_size=32)
    message = str(info.value)
    assert message.startswith(
        f"The checkpoint of backbone 'timm:local-dir:{tmp_path}' does not fit the timm model "
        f"'local-dir:{tmp_path}': "
    )
    assert message.endswith(
        ". Its config.json must name the architecture its weights were trained as."
    )
    # timm 1.0.31 looks up the first convolution before loading; earlier ones load the
    # weights and meet the resnet's keys.
    cause = message.split(": ", 1)[1]
    assert cause.startswith(
        ("VisionTransformer has no attribute `conv1`, which its config names.",
         'Unexpected key(s) in state_dict: "conv1.0.weight"')
    )  # fmt: skip


def test_hub_offline_setting_is_respected(no_network, monkeypatch):
    from extract import WeightsUnavailableError

    def forbidden():
        raise AssertionError("the hub was contacted although HF_HUB_OFFLINE is set")

    monkeypatch.setattr("extract._weights._hub_reachable", forbidden)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(WeightsUnavailableError, match="HF_HUB_OFFLINE is set"):
        create_backbone("timm:test_resnet")


@pytest.mark.parametrize("offline", ["", "1"])
def test_an_uncached_hub_config_is_spoken_of_as_one_file(no_network, monkeypatch, offline):
    # 'hf-hub:...@random' needs the config alone: "The config ... could not be loaded: they
    # are not in the local cache ... Download them once".
    from extract import WeightsUnavailableError

    monkeypatch.setenv("HF_HUB_OFFLINE", offline)
    with pytest.raises(WeightsUnavailableError) as info:
        create_backbone("timm:hf-hub:nobody/saved-resnet@random")
    message = str(info.value)
    assert "could not be loaded: it is not in the local cache" in message
    assert "Download it once where there is a network (it is cached)" in message
    with pytest.raises(WeightsUnavailableError) as info:
        create_backbone("timm:hf-hub:nobody/saved-resnet")
    message = str(info.value)
    assert "could not be loaded: they are not in the local cache" in message
    assert "Download them once where there is a network (they are cached)" in message


def test_building_a_backbone_leaves_every_random_generator_as_it_was(monkeypatch):
    # torch.manual_seed(0) reseeded every CUDA device's generator too, which fork_rng over
    # the CPU alone did not restore: a training loop's CUDA randomness was reset.
    seeded = []
    monkeypatch.setattr(torch.cuda, "manual_seed_all", lambda seed: seeded.append(seed))
    state = torch.random.get_rng_state()
    create_backbone("timm:test_resnet@random", image_size=32)
    assert not seeded and torch.equal(torch.random.get_rng_state(), state)


def test_timm_default_loads_cached_hub_weights_without_network(no_network, monkeypatch):
    import timm
    from safetensors.torch import save_file
    from timm.models import get_pretrained_cfg

    def forbidden():
        raise AssertionError("cached weights need no network")

    monkeypatch.setattr("extract._weights._hub_reachable", forbidden)
    # The Hugging Face cache layout: refs/main names the snapshot holding the file.
    repo = no_network / f"models--{get_pretrained_cfg('test_resnet').hf_hub_id.replace('/', '--')}"

    def cache(revision: str, seed: int) -> torch.nn.Module:
        snapshot = repo / "snapshots" / (revision * 40)
        snapshot.mkdir(parents=True)
        torch.manual_seed(seed)
        reference = timm.create_model("test_resnet").eval()
        save_file(reference.state_dict(), snapshot / "model.safetensors")
        (repo / "refs").mkdir(exist_ok=True)
        (repo / "refs" / "main").write_text(revision * 40)
        return reference

    from huggingface_hub import constants

    reference = cache("0", seed=5)
    offline = constants.HF_HUB_OFFLINE
    bb = create_backbone("timm:test_resnet", image_size=32)
    assert constants.HF_HUB_OFFLINE == offline  # the hub's offline mode is as it was
    assert re.fullmatch(r"tag:test_resnet\.r160_in1k params-sha256:[0-9a-f]{64}", bb.weights_id)
    x = torch.rand(2, 3, 32, 32)
    with torch.inference_mode():
        expected = reference.forward_head(reference.forward_features(x), pre_logits=True)
        torch.testing.assert_close(bb.model(x), expected)
    assert create_backbone("timm:test_resnet", image_size=32).weights_id == bb.weights_id
    # Another revision in the cache under the same tag was the same weights id: a run
    # resumed a store made with the old weights and mixed the two in it.
    cache("1", seed=6)
    assert create_backbone("timm:test_resnet", image_size=32).weights_id != bb.weights_id


def test_open_clip_default_tag_offline_and_models_without_tags(no_network, tmp_path, capfd):
    import open_clip

    from extract import BackboneError, WeightsUnavailableError

    name = register_tiny_open_clip(tmp_path)
    with pytest.raises(BackboneError, match=f"open_clip lists no pretrained weights for '{name}'"):
        create_backbone(f"open_clip:{name}")
    fake = {"fake_tag": open_clip.pretrained._pcfg(hf_hub="nobody/tiny-clip-test/")}
    open_clip.pretrained._PRETRAINED[name] = fake
    try:
        with pytest.raises(WeightsUnavailableError, match="tag 'fake_tag'") as info:
            create_backbone(f"open_clip:{name}")  # the first listed tag
        # A tag in other case and with '-', as open_clip takes it, is that tag.
        with pytest.raises(WeightsUnavailableError, match="tag 'fake_tag'"):
            create_backbone(f"open_clip:{name}@Fake-Tag")
    finally:
        del open_clip.pretrained._PRETRAINED[name]
    assert f"open_clip:{name}@/path/to/checkpoint.pth" in str(info.value)
    # open_clip's own error log and hub retries are summarised by the one error.
    assert "Failed to download" not in capfd.readouterr().err


def test_effnet_lite0_random():
    bb = create_backbone("effnet-lite0@random", image_size=32)
    assert bb.dim == 1280 and bb.weights_id.startswith("random-init:seed0 params-sha256:")
    assert bb.preprocess["mean"] == [0.5, 0.5, 0.5]


# open_clip's own note on the tag 'plain' (no QuickGELU) of a config with QuickGELU, a
# combination built here on purpose.
@pytest.mark.filterwarnings("ignore:QuickGELU mismatch between final model config:UserWarning")
def test_openai_weights_run_with_quick_gelu_as_trained(tmp_path, monkeypatch):
    # open_clip's "ViT-B-32" config has GELU, and its tag 'openai' weights were trained with
    # QuickGELU: open_clip only warns, and the store recorded features of a network the
    # weights were not trained for, under a weights id that looked right. A ResNet image
    # tower has no such activation, nor needs a config that has QuickGELU already one
    # forced on it: their weights ids stay as they were.
    import open_clip
    import open_clip.factory

    name = register_tiny_open_clip(tmp_path)
    config = json.loads((tmp_path / f"{name}.json").read_text())
    resnet = dict(config, vision_cfg={"image_size": 32, "layers": [1, 1, 1, 1], "width": 8})
    others = {"tiny-rn-test": resnet, "tiny-quick-test": dict(config, quick_gelu=True)}
    for model, other in others.items():
        (tmp_path / f"{model}.json").write_text(json.dumps(other))
        open_clip.add_model_config(tmp_path / f"{model}.json")
    files = {}
    for model in (name, *others):
        source, _, _ = open_clip.create_model_and_transforms(model, pretrained=None)
        files[model] = tmp_path / f"{model}.pt"
        torch.save(source.state_dict(), files[model])
    loading = {}
    monkeypatch.setattr(
        open_clip.factory, "download_pretrained", lambda *a, **k: str(files[loading["model"]])
    )
    tags = {
        "quick": open_clip.pretrained._pcfg(hf_hub="nobody/q/", quick_gelu=True),
        "plain": open_clip.pretrained._pcfg(hf_hub="nobody/p/"),
    }
    built = {}
    for model in (name, *others):
        monkeypatch.setitem(open_clip.pretrained._PRETRAINED, model, tags)
        loading["model"] = model
        built[model] = {tag: create_backbone(f"open_clip:{model}@{tag}") for tag in tags}
    quick, plain = built[name]["quick"], built[name]["plain"]
    assert isinstance(
        quick.model.transformer.resblocks[0].mlp.gelu, open_clip.transformer.QuickGELU
    )
    assert not isinstance(
        plain.model.transformer.resblocks[0].mlp.gelu, open_clip.transformer.QuickGELU
    )
    assert quick.weights_id.startswith("tag:quick run with QuickGELU params-sha256:")
    assert plain.weights_id.startswith("tag:plain params-sha256:")
    x = torch.rand(2, 3, 32, 32)
    with torch.inference_mode():
        assert not torch.allclose(quick.model(x), plain.model(x))
    assert built["tiny-rn-test"]["quick"].weights_id.startswith("tag:quick params-sha256:")
    configured = built["tiny-quick-test"]["quick"]
    assert isinstance(
        configured.model.transformer.resblocks[0].mlp.gelu, open_clip.transformer.QuickGELU
    )
    assert configured.weights_id.startswith("tag:quick params-sha256:")


def test_unreadable_checkpoints_are_one_error_line_for_every_family(tmp_path):
    # A file that is no checkpoint, or a truncated one, gave timm's and open_clip's (and
    # Lite0's) tracebacks, or "[Errno 22] Invalid argument" without the file's name.
    import timm

    from extract import BackboneError

    torch.save(timm.create_model("resnet18", num_classes=0).state_dict(), tmp_path / "r18.pth")
    whole = (tmp_path / "r18.pth").read_bytes()
    (tmp_path / "truncated.pth").write_bytes(whole[: len(whole) // 2])
    (tmp_path / "notes.pth").write_bytes(b"not a checkpoint\n" * 20)
    name = register_tiny_open_clip(tmp_path)
    for file in ("truncated.pth", "notes.pth"):
        path = tmp_path / file
        for spec in (f"timm:resnet18@{path}", f"open_clip:{name}@{path}", f"effnet-lite0@{path}"):
            with pytest.raises(
                BackboneError, match=rf"'{path}' cannot be read as a PyTorch checkpoint"
            ) as info:
                create_backbone(spec, image_size=32)
            assert "\n" not in str(info.value)


def test_a_checkpoint_that_holds_no_mapping_is_one_error_line(tmp_path):
    # timm's and open_clip's AttributeError traceback ("'list' object has no attribute
    # 'items'").
    from extract import BackboneError

    path = tmp_path / "list.pth"
    torch.save([1, 2, 3], path)
    name = register_tiny_open_clip(tmp_path)
    for spec in (f"timm:resnet18@{path}", f"open_clip:{name}@{path}"):
        with pytest.raises(BackboneError, match="holds a list, not a state_dict"):
            create_backbone(spec, image_size=32)


def test_a_truncated_safetensors_checkpoint_is_one_error_line(tmp_path):
    # timm's traceback (SafetensorError, exit 1), and open_clip's misfit blamed on the
    # model ("Pass a state_dict of the whole model").
    import timm
    from safetensors.torch import save_file

    from extract import BackboneError

    whole = tmp_path / "whole.safetensors"
    save_file(timm.create_model("resnet18", num_classes=0).state_dict(), whole)
    path = tmp_path / "truncated.safetensors"
    path.write_bytes(whole.read_bytes()[: whole.stat().st_size // 2])
    name = register_tiny_open_clip(tmp_path)
    for spec in (f"timm:resnet18@{path}", f"open_clip:{name}@{path}"):
        with pytest.raises(BackboneError, match="cannot be read as a safetensors file") as info:
            create_backbone(spec, image_size=32)
        assert "\n" not in str(info.value)


def test_an_open_clip_model_folder_without_its_config_is_named(tmp_path):
    # open_clip's FileNotFoundError was read as a failed download: "no network".
    from extract import BackboneError

    (tmp_path / "a.txt").write_text("")
    for where, what in (
        (tmp_path / "nowhere", "does not exist"),
        (tmp_path / "a.txt", "is no folder"),
        (tmp_path, "holds no open_clip"),
    ):
        with pytest.raises(BackboneError, match=what):
            create_backbone(f"open_clip:local-dir:{where}", image_size=32)


def test_a_folder_named_as_a_pretrained_tag_is_no_checkpoint(no_network, tmp_path, monkeypatch):
    # open_clip:RN50@openai with a folder ./openai was refused as "a folder, not a
    # checkpoint file"; the tag is meant (here: offline, the download's error).
    from extract import BackboneError

    (tmp_path / "openai").mkdir()
    monkeypatch.chdir(tmp_path)
    with pytest.raises(BackboneError) as info:
        create_backbone("open_clip:RN50@openai", image_size=32)
    assert "is a folder" not in str(info.value) and "tag 'openai'" in str(info.value)


def test_effnet_lite0_takes_timm_s_names_and_wrapped_states(tmp_path):
    # timm's own tf_efficientnet_lite0 state (as `module.` under `state_dict` too) failed
    # with KeyError: 'conv_stem'; a state of another model listed every missing key.
    import timm

    from extract import BackboneError

    torch.manual_seed(0)
    lite = timm.create_model("tf_efficientnet_lite0", num_classes=0).eval()
    wrapped = {"state_dict": {f"module._orig_mod.{k}": v for k, v in lite.state_dict().items()}}
    wrapped["state_dict"]["_version"] = 1  # torch.compile's prefix, a private entry
    torch.save(wrapped, tmp_path / "lite0.pth")
    bb = create_backbone(f"effnet-lite0@{tmp_path / 'lite0.pth'}", image_size=32)
    x = torch.rand(2, 3, 32, 32)
    with torch.inference_mode():
        torch.testing.assert_close(bb.model(x), lite(x))
    torch.save({"model": lite.state_dict()}, tmp_path / "nested.pth")  # (as timm's scripts)
    nested = create_backbone(f"effnet-lite0@{tmp_path / 'nested.pth'}", image_size=32)
    with torch.inference_mode():
        torch.testing.assert_close(nested.model(x), lite(x))
    torch.save({"x": torch.zeros(1)}, tmp_path / "other.pth")
    with pytest.raises(
        BackboneError, match=r"245 of its parameters are not in the checkpoint \(conv_stem"
    ) as info:
        create_backbone(f"effnet-lite0@{tmp_path / 'other.pth'}", image_size=32)
    assert "\n" not in str(info.value)
    assert str(info.value).endswith("; 1 of the checkpoint's weights have no place in it (x).")
    # A deeper model's weights beside all of Lite0's: refused, not the rest loaded.
    deeper = lite.state_dict() | {"blocks.6.1.conv_pw.weight": torch.zeros(1)}
    torch.save(deeper, tmp_path / "deeper.pth")
    with pytest.raises(
        BackboneError,
        match=r"match the architecture 'tf_efficientnet_lite0': 1 of the checkpoint's weights "
        r"have no place in it \(blocks\.6\.1\.conv_pw\.weight\)\.$",
    ):
        create_backbone(f"effnet-lite0@{tmp_path / 'deeper.pth'}", image_size=32)


def test_file_sha256_is_the_sha256_of_the_whole_file(tmp_path):
    # Read in blocks: a file longer than one block is hashed whole.
    import hashlib

    data = bytes(range(256)) * 4200  # over 1 MiB
    (tmp_path / "w.pth").write_bytes(data)
    assert file_sha256(tmp_path / "w.pth") == "sha256:" + hashlib.sha256(data).hexdigest()


def test_library_logs_are_quiet_while_weights_load_and_as_before_after(caplog):
    # huggingface_hub's retry warnings and open_clip's root-logger records are dropped
    # while weights load; the root logger's other records pass, and afterwards every
    # logger is as it was.
    import logging

    from extract._weights import _quiet_library_logs

    hub, root = logging.getLogger("huggingface_hub"), logging.getLogger()
    level, filters = hub.level, list(root.filters)

    def from_open_clip():
        where = os.path.join(os.sep, "site-packages", "open_clip", "factory.py")
        return logging.LogRecord("root", logging.ERROR, where, 1, "open_clip says", None, None)

    with caplog.at_level(logging.INFO):
        with _quiet_library_logs():
            hub.warning("Retrying in 1s")
            root.handle(from_open_clip())
            root.warning("ours")
        assert [r.getMessage() for r in caplog.records] == ["ours"]
        assert hub.level == level and root.filters == filters
        root.handle(from_open_clip())
        assert caplog.records[-1].getMessage() == "open_clip says"


def test_quiet_library_logs_install_no_handler_of_their_own(monkeypatch):
    # open_clip's logging.error would install a stderr handler on a root logger that has
    # none, for good; none is left behind.
    import logging

    from extract._weights import _quiet_library_logs

    root = logging.getLogger()
    monkeypatch.setattr(root, "handlers", [])
    with _quiet_library_logs():
        logging.error("an error that open_clip logs through the root logger")
    assert root.handlers == []


def test_a_hub_model_s_weights_may_leave_parameters_out_but_a_folder_s_may_not(
    no_network, tmp_path
):
    # timm loads a hub model's weights leniently (dla and mobilenetv5 leave keys out by
    # design); a local folder's are held to every parameter.
    import timm
    from timm.models import save_for_hf

    from extract import BackboneError

    torch.manual_seed(3)
    reference = timm.create_model("test_resnet", num_classes=10)  # saved with its classifier
    folder = tmp_path / "short"
    save_for_hf(reference, folder)
    state = {k: v for k, v in reference.state_dict().items() if k != "layer1.0.conv1.weight"}
    torch.save(state, folder / "pytorch_model.bin")
    _into_hub_cache(folder, no_network, "nobody/short-resnet")
    bb = create_backbone("timm:hf-hub:nobody/short-resnet", image_size=32)
    assert bb.weights_id.startswith("tag:hf-hub:nobody/short-resnet params-sha256:")
    with pytest.raises(BackboneError, match=r"1 of its parameters are not in it"):
        create_backbone(f"timm:local-dir:{folder}", image_size=32)


def test_a_lite0_checkpoint_that_holds_no_state_dict_is_one_error(tmp_path):
    from extract import BackboneError

    for name, checkpoint in [("list", [torch.zeros(1)]), ("numbered", {0: torch.zeros(1)})]:
        torch.save(checkpoint, tmp_path / f"{name}.pth")
        with pytest.raises(BackboneError, match="holds no state dict of EfficientNet-Lite0"):
            create_backbone(f"effnet-lite0@{tmp_path / f'{name}.pth'}", image_size=32)
    # The package's names, one of a block that Lite0 does not have.
    torch.save(
        {"_conv_stem.weight": torch.zeros(1), "_blocks.99._bn0.weight": torch.zeros(1)},
        tmp_path / "deeper.pth",
    )
    with pytest.raises(BackboneError, match="no place for its key"):
        create_backbone(f"effnet-lite0@{tmp_path / 'deeper.pth'}", image_size=32)


def test_an_open_clip_hub_model_out_of_reach_is_one_error_with_no_other_weights_offered(
    no_network,
):
    # Its weights come with its config: no checkpoint, nor timm's folder, can replace them.
    from extract import WeightsUnavailableError

    with pytest.raises(WeightsUnavailableError, match="could not be loaded") as info:
        create_backbone("open_clip:hf-hub:nobody/clip")
    message = str(info.value)
    assert message.startswith("The pretrained weights of 'open_clip:hf-hub:nobody/clip'")
    assert "save_for_hf" not in message and "@/path/to/checkpoint" not in message


def test_moco_weights_keep_a_head_that_belongs_to_the_backbone():
    # A head the model has among its own keys (ConvNeXt's final norm) is kept; MoCo's
    # projection head and the ResNets' fc are dropped.
    encoder = "module.base_encoder."
    state = {encoder + "head.norm.weight": torch.ones(2), encoder + "head.0.weight": torch.ones(2)}
    state |= {encoder + "fc.weight": torch.ones(2), encoder + "stem.weight": torch.ones(2)}
    kept = moco_state_dict({"state_dict": state}, keys={"stem.weight", "head.norm.weight"})
    assert set(kept) == {"stem.weight", "head.norm.weight"}
    assert set(moco_state_dict({"state_dict": state})) == {"stem.weight"}


def test_an_attribute_error_of_the_library_s_own_is_not_blamed_on_the_checkpoint(
    tmp_path, monkeypatch
):
    # Only timm's look-up of a layer that a config names ("has no attribute `name`") is the
    # checkpoint's; any other AttributeError is raised as it is.
    import timm

    path = tmp_path / "w.pth"
    _save_timm_checkpoint(path, "test_resnet", seed=7)

    def broken(*args, **kwargs):
        raise AttributeError("'NoneType' object has no attribute 'shape'")

    monkeypatch.setattr(timm, "create_model", broken)
    with pytest.raises(AttributeError, match="'NoneType' object has no attribute 'shape'"):
        create_backbone(f"timm:test_resnet@{path}", image_size=32)


@pytest.mark.parametrize(
    "error", [TypeError("an unexpected keyword"), RuntimeError("CUDA error: out of memory")]
)
def test_other_errors_of_a_build_at_the_input_size_are_raised_as_they_are(monkeypatch, error):
    # Only a model that takes no img_size, or a checkpoint timm cannot resize, is built at
    # its own size instead; any other error of the build is the caller's to see.
    import timm

    create = timm.create_model

    def failing_with_img_size(name, **kwargs):
        if "img_size" in kwargs:
            raise error
        return create(name, **kwargs)

    monkeypatch.setattr(timm, "create_model", failing_with_img_size)
    with pytest.raises(type(error), match=str(error)):
        create_backbone("timm:test_vit@random", image_size=32)


def test_a_timm_model_without_pretrained_weights_asks_for_a_checkpoint_or_random():
    import timm

    from extract import BackboneError

    # A test model that timm lists no weights for (which ones have weights changes by release).
    weighted = {name.partition(".")[0] for name in timm.list_pretrained("test_*")}
    name = min(set(timm.list_models("test_*")) - weighted)
    with pytest.raises(BackboneError) as info:
        create_backbone(f"timm:{name}")
    assert str(info.value) == (
        f"timm lists no pretrained weights for {name!r}; pass a local checkpoint "
        f"('timm:{name}@/path/to/checkpoint.pth') or ask for random weights ('timm:{name}@random')."
    )


def test_random_weights_are_timm_s_initialisation_from_seed_0():
    # "random-init:seed0" names the weights that seed 0 gives: anyone can rebuild them.
    import timm

    bb = create_backbone("timm:test_resnet@random", image_size=32)
    torch.manual_seed(0)
    reference = timm.create_model("test_resnet", num_classes=0).eval()
    x = torch.rand(2, 3, 32, 32)
    with torch.inference_mode():
        torch.testing.assert_close(bb.model(x), reference(x))


def test_the_params_weights_id_tells_apart_the_same_bytes_under_other_names_or_shapes():
    from extract._weights import params_weights_id

    wide, tall = torch.nn.Linear(4, 2, bias=False), torch.nn.Linear(2, 4, bias=False)
    with torch.no_grad():
        tall.weight.copy_(wide.weight.reshape(4, 2))
    renamed = torch.nn.Sequential(wide)  # the same tensor, as "0.weight"
    ids = {params_weights_id("x", m) for m in (wide, tall, renamed)}
    assert len(ids) == 3


def test_failed_file_fetches_are_told_from_other_errors():
    # An OSError (a URL that cannot be reached), or an error raised from one, is a failed
    # fetch; any other error is the model's own.
    import threading
    import urllib.error

    from extract._weights import _is_download_error

    assert _is_download_error(urllib.error.URLError("no network"))
    try:
        try:
            raise ConnectionError("reset")
        except ConnectionError as err:
            raise RuntimeError("the model could not be built") from err
    except RuntimeError as err:
        assert _is_download_error(err)
    assert not _is_download_error(RuntimeError("size mismatch"))
    # Two errors raised from each other end the walk down the chain (watched in a thread).
    first, second = ValueError("a"), RuntimeError("b")
    first.__cause__, second.__cause__ = second, first
    answers = []
    walk = threading.Thread(target=lambda: answers.append(_is_download_error(first)), daemon=True)
    walk.start()
    walk.join(timeout=10)
    assert answers == [False]


def test_a_timm_transform_that_squashes_is_recorded_as_squashing():
    # timm's eval transforms crop at the centre, squash or pad ("crop_mode"): the store
    # records which, and a squashed image is seen whole.
    import timm

    from extract._backbones import _timm_data

    model = timm.create_model("test_resnet", num_classes=0)
    _, center = _timm_data(model, 32)
    _, squash = _timm_data(model, 32, crop_mode="squash")
    assert center["mode"] == "center" and "max_aspect" not in center
    assert squash["mode"] == "squash" and squash["max_aspect"] == 32
