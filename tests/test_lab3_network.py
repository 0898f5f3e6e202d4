"""Lab 3's network files and data: clear loader errors, accuracy without padding, the offline digits,
and a one-epoch training that survives a safetensors round trip bit for bit. CPU only, offline data."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("safetensors")
pytest.importorskip("sklearn")

from lab3 import mnist, network, train  # noqa: E402 (after the skips above)


@pytest.fixture(scope="module")
def digits() -> mnist.Digits:
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("LAB3_DATA", "offline")
        return mnist.load("mnist")  # the environment variable wins over prefer


def mlp_tensors() -> dict[str, torch.Tensor]:
    return {k: torch.zeros(shape, dtype=torch.float32) for k, (shape, _) in network.SCHEMA["mlp"].items()}


def write(tmp_path, tensors, arch="mlp"):
    network.write_safetensors(network.weights_path(arch, tmp_path), tensors, {"arch": arch})
    return network.weights_path(arch, tmp_path)


def assert_weights_error(tmp_path, *words):
    with pytest.raises(network.WeightsError) as err:
        network.load_mlp(tmp_path)
    message = str(err.value)
    for word in (str(network.weights_path("mlp", tmp_path)), "make train-lab3", *words):
        assert word in message, message


def test_network_import_does_not_import_torch():
    import subprocess
    import sys

    code = "import sys, lab3.network; assert 'torch' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True)


def test_valid_file_loads(tmp_path):
    write(tmp_path, mlp_tensors())
    assert set(network.load_mlp(tmp_path)) == set(network.SCHEMA["mlp"])


def test_missing_file(tmp_path):
    assert_weights_error(tmp_path, "missing")


@pytest.mark.parametrize("keep", [0, 5, 40, 4000])
def test_truncated_file(tmp_path, keep):
    path = write(tmp_path, mlp_tensors())
    path.write_bytes(path.read_bytes()[:keep])
    assert_weights_error(tmp_path, "truncated or not a safetensors file")


def test_not_safetensors(tmp_path):
    network.weights_path("mlp", tmp_path).write_bytes(b"PK\x03\x04 a zip, say a torch.save checkpoint" * 10)
    assert_weights_error(tmp_path, "not a safetensors file")


def test_wrong_shape_names_expected_and_found(tmp_path):
    tensors = mlp_tensors()
    tensors["fc1.weight"] = torch.zeros(784, 1000)  # transposed
    write(tmp_path, tensors)
    assert_weights_error(tmp_path, "fc1.weight", "(784, 1000)", "expected (1000, 784)")


def test_wrong_dtype(tmp_path):
    tensors = mlp_tensors()
    tensors["fc2.bias"] = tensors["fc2.bias"].half()
    write(tmp_path, tensors)
    assert_weights_error(tmp_path, "fc2.bias", "float16", "float32")


def test_missing_key(tmp_path):
    tensors = mlp_tensors()
    del tensors["fc1.bias"]
    write(tmp_path, tensors)
    assert_weights_error(tmp_path, "missing key fc1.bias")


def test_testset_x_and_y_must_agree(tmp_path):
    tensors = {"x": torch.zeros(5, 1, 28, 28), "y": torch.zeros(4, dtype=torch.int64)}
    write(tmp_path, tensors, "testset")
    with pytest.raises(network.WeightsError, match=r"y has shape \(4,\), expected \(5,\)"):
        network.load_testset(tmp_path)


def test_accuracy_counts_exactly_n():
    labels = torch.tensor([0, 1, 2, 3, 4])
    logits = torch.nn.functional.one_hot(torch.tensor([0, 1, 2, 3, 0]), 10).float()
    assert network.accuracy(logits, labels) == pytest.approx(0.8)
    assert network.accuracy(np.array([0, 1, 2, 3, 4]), labels.numpy()) == 1.0


def test_accuracy_refuses_padding():
    labels = torch.tensor([0, 1, 2])
    padded = torch.zeros(8, 10)  # a last batch padded to 8 slots; the zeros would "predict" class 0
    with pytest.raises(ValueError, match="no padding"):
        network.accuracy(padded, labels)
    with pytest.raises(ValueError, match="no padding"):
        network.accuracy(torch.tensor([0, 1, 2, 0]), labels)


def test_offline_digits_shapes_and_normalization(digits):
    assert digits.kind == "offline" and digits.name in digits.source
    assert digits.train_x.shape == (1437, 1, 28, 28) and digits.test_x.shape == (360, 1, 28, 28)
    assert digits.train_x.dtype == np.float32 and digits.train_y.dtype == np.int64
    assert sorted(set(digits.test_y.tolist())) == list(range(10))  # stratified: every class in the test set
    blank = (0.0 - mnist.MEAN) / mnist.STD  # an empty pixel
    assert digits.train_x.min() == pytest.approx(blank, abs=1e-6)
    assert digits.train_x.max() <= (1.0 - mnist.MEAN) / mnist.STD + 1e-6
    again = mnist.load_offline()  # the split is deterministic
    assert np.array_equal(again.test_y, digits.test_y) and np.array_equal(again.test_x, digits.test_x)


def test_unknown_data_choice(monkeypatch):
    monkeypatch.setenv("LAB3_DATA", "cifar")
    with pytest.raises(ValueError, match="auto, mnist or offline"):
        mnist.load()


@pytest.mark.parametrize("arch", ["mlp", "cnn"])
def test_one_epoch_round_trip(digits, tmp_path, arch):
    result = train.train(arch, digits, epochs=1)
    assert 0.5 < result.accuracy <= 1.0  # one epoch already learns something
    train.save(result, digits, tmp_path)
    train.save_testset(digits, tmp_path)
    loaded = network.load_mlp(tmp_path) if arch == "mlp" else network.load_cnn(tmp_path)
    model = train.ARCHS[arch]()
    model.load_state_dict(loaded)
    testset = network.load_testset(tmp_path)
    ours = train.predict_logits(model, testset["x"])
    theirs = train.predict_logits(result.model, torch.from_numpy(digits.test_x))
    assert torch.equal(ours, theirs)
    assert network.accuracy(ours, testset["y"]) == result.accuracy
    meta = network.metadata(arch, tmp_path)
    assert (
        meta["arch"] == arch
        and meta["dataset"] == digits.name
        and float(meta["accuracy"]) == pytest.approx(result.accuracy, abs=1e-6)
    )


def test_ensure_trained_fills_in_only_what_is_missing(digits, tmp_path, monkeypatch):
    monkeypatch.setattr(train, "EPOCHS", dict.fromkeys(train.EPOCHS, 1))
    monkeypatch.setattr(train, "THRESHOLDS", dict.fromkeys(train.THRESHOLDS, 0.5))
    monkeypatch.setenv("LAB3_DATA", "offline")
    network.ensure_trained(tmp_path)
    stamps = {a: network.weights_path(a, tmp_path).stat().st_mtime_ns for a in network.SCHEMA}
    network.weights_path("cnn", tmp_path).write_bytes(b"damaged")
    network.ensure_trained(tmp_path)
    assert network.weights_path("mlp", tmp_path).stat().st_mtime_ns == stamps["mlp"]
    assert network.weights_path("testset", tmp_path).stat().st_mtime_ns == stamps["testset"]
    network.load_cnn(tmp_path)
    assert not list(tmp_path.glob(".*.tmp"))  # the atomic writes left no temporary files
