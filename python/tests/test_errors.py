"""The exception tree: native classes, shown and pickled as ``stoker.errors`` classes."""

import pickle

import pytest
import stoker
import stoker._stoker as native
import stoker.errors as errors

TREE = {
    "StokerError": (Exception,),
    "ConfigError": (errors.StokerError, ValueError),
    "DatasetError": (errors.StokerError,),
    "DecodeError": (errors.StokerError,),
    "ReadError": (errors.StokerError, OSError),
    "MemoryLimitError": (errors.StokerError, MemoryError),
    "DeviceError": (errors.StokerError, RuntimeError),
}


@pytest.mark.parametrize("name", sorted(TREE))
def test_one_class_per_category_with_its_standard_base(name):
    cls = getattr(errors, name)
    assert cls is getattr(stoker, name) is getattr(native, name)
    assert cls.__bases__ == TREE[name]
    assert cls.__module__ == "stoker.errors" and cls.__qualname__ == name
    assert cls.__doc__ and cls.__doc__.strip()
    assert name in errors.__all__ and name in stoker.__all__


@pytest.mark.parametrize("name", sorted(TREE))
def test_errors_pickle_as_themselves(name):
    cls = getattr(errors, name)
    back = pickle.loads(pickle.dumps(cls("some/file.jpg: why")))
    assert type(back) is cls
    assert isinstance(back, errors.StokerError) and isinstance(back, TREE[name])
    assert back.args == ("some/file.jpg: why",)


def test_an_error_raised_by_the_engine_pickles():
    with pytest.raises(stoker.ConfigError) as raised:
        native.dtype_name("not-a-dtype")
    back = pickle.loads(pickle.dumps(raised.value))
    assert type(back) is errors.ConfigError
    assert isinstance(back, ValueError)
    assert "dtype" in str(back) and str(back) == str(raised.value)


def test_a_missing_dataset_is_caught_as_a_stoker_error(tmp_path):
    with pytest.raises(errors.StokerError) as raised:
        stoker.ImageLoader(str(tmp_path / "missing"), batch_size=2, preset="imagenet-val")
    assert "missing" in str(raised.value)
    assert type(raised.value).__module__ == "stoker.errors"
