"""Op facts are declared where the op is registered and read back from the registry."""

from __future__ import annotations

import ast
import pathlib

import pytest

import workbench
from workbench.ops import registry


def test_facts_given_in_the_decorator():
    f = registry.facts("Reshape")
    assert f.category == "shape" and f.host_read_inputs == (1,) and f.host_shape_math
    assert f.host_inputs == (1,) and f.host_compute      # the old spellings still read
    assert registry.facts("Dropout").random and registry.facts("Dropout").settings == (1, 2)
    assert registry.facts("BatchNormalization").state_inputs == (3, 4)
    assert registry.facts("Shape").shape_only and registry.facts("Size").shape_only
    assert registry.facts("RandomNormal").random
    assert not registry.facts("Conv").random and registry.category("Conv") == "layer"
    # an op nobody described has the defaults
    assert registry.facts("NoSuchOp") == registry.OpFacts()
    assert registry.category("NoSuchOp") == "other"


def test_described_contrib_ops_and_domains():
    assert registry.category("FastGelu") == "activation"
    assert registry.category("FastGelu", "com.microsoft") == "activation"
    assert registry.category("FastGelu", "") == "other"
    # ai.onnx is the default domain
    assert registry.facts("Reshape", "ai.onnx") == registry.facts("Reshape")


def test_custom_op_registers_its_facts_and_training_form():
    def my_noise(x):
        return x

    def my_noise_train(x):
        return x + 1

    try:
        registry.register("MyNoise", my_noise, domain="com.example", random=True,
                          category="math", settings=(1,))
        registry.register("MyNoise", my_noise_train, domain="com.example", train=True)
        f = registry.facts("MyNoise", "com.example")
        assert f.random and f.category == "math" and f.settings == (1,)
        assert registry.lookup("MyNoise", "com.example", 1).fn is my_noise
        assert registry.train_form("MyNoise", "com.example", 1).fn is my_noise_train
        assert registry.train_form("Relu", "", 14) is None
        with pytest.raises(TypeError, match="unknown op facts"):
            registry.describe("MyNoise", domain="com.example", colour="red")
    finally:
        registry.unregister("MyNoise", domain="com.example")
        registry.unregister("MyNoise", domain="com.example", train=True)
    assert registry.train_form("MyNoise", "com.example", 1) is None
    assert not registry.has_kernel("MyNoise", "com.example")


def _op_name_tables(path: pathlib.Path) -> list[str]:
    """Module-level sets/dicts/tuples whose keys or items are mostly registered op names."""
    ops = {op for _, op in registry.registered_ops()}
    found = []
    tree = ast.parse(path.read_text(encoding="utf-8"))
    for node in tree.body:
        if not isinstance(node, (ast.Assign, ast.AnnAssign)):
            continue
        value = node.value
        if isinstance(value, ast.Call) and value.args:    # frozenset({...})
            value = value.args[0]
        items = []
        if isinstance(value, ast.Dict):
            items = value.keys
        elif isinstance(value, (ast.Set, ast.Tuple, ast.List)):
            items = value.elts
        names = [i.value for i in items if isinstance(i, ast.Constant)
                 and isinstance(i.value, str)]
        if len(names) >= 4 and sum(n in ops for n in names) >= 0.75 * len(names):
            found.append(f"{path.name}:{node.lineno}")
    return found


def test_no_op_name_tables_outside_the_ops():
    root = pathlib.Path(workbench.__file__).parent
    tables = []
    for p in sorted(root.rglob("*.py")):
        rel = p.relative_to(root).as_posix()
        if rel.startswith(("ops/", "arrays/cuda/", "grad/")):
            continue   # the ops' own registrations (kernels, overrides, gradient rules)
        tables += _op_name_tables(p)
    assert not tables, f"tables of op names outside the ops' registration: {tables}"


def test_a_second_registration_is_refused_unless_replace():
    def first(x):
        return x

    def second(x):
        return -x

    try:
        registry.register("Twice", first, domain="com.example", since=3)
        with pytest.raises(ValueError, match=r"com.example::Twice since opset 3: a kernel is "
                                             r"already registered \(.*\.first\); registering "
                                             r".*\.second as well .* replace=True"):
            registry.register("Twice", second, domain="com.example", since=3)
        assert registry.lookup("Twice", "com.example", 5).fn is first
        registry.register("Twice", second, domain="com.example", since=5)   # another version
        assert registry.lookup("Twice", "com.example", 5).fn is second
        # the override of an array module and the training form are registrations of their own
        registry.register("Twice", second, domain="com.example", since=3, xp="cupy")
        registry.register("Twice", second, domain="com.example", since=3, train=True)
        registry.register("Twice", second, domain="com.example", since=3, xp="cupy",
                          train=True)
        with pytest.raises(ValueError, match=r"training form \(cupy override\) is already"):
            registry.register("Twice", first, domain="com.example", since=3, xp="cupy",
                              train=True)
        with pytest.raises(ValueError, match="already registered"):
            registry.kernel("Twice", since=3, domain="com.example")(second)
        registry.kernel("Twice", since=3, domain="com.example", replace=True)(second)
        assert registry.lookup("Twice", "com.example", 4).fn is second
    finally:
        for kw in ({}, {"xp": "cupy"}, {"train": True}, {"xp": "cupy", "train": True}):
            registry.unregister("Twice", domain="com.example", **kw)


def test_the_engines_own_kernels_cannot_be_replaced_by_accident():
    """Every family and the cupy overrides imported (each registration checked on the way);
    registering one of the engine's kernels again is refused."""
    from workbench.ops import cuda  # noqa: F401 - the overrides load on the first cupy lookup
    assert registry.overrides("cupy")
    entry = registry.lookup("Relu", "", 14)
    with pytest.raises(ValueError, match=r"ai.onnx::Relu since opset \d+: a kernel is already"):
        registry.register("Relu", lambda x: x, since=entry.since)
    assert registry.lookup("Relu", "", 14) is entry


def test_a_missing_family_file_is_an_error():
    import workbench.ops as ops
    with pytest.raises(ModuleNotFoundError, match="workbench.ops.no_such_family"):
        ops.load_families(("no_such_family",))
    assert "contrib_transformer" in ops._FAMILIES
