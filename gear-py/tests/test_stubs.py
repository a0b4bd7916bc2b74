"""The type stubs describe the module as it is, and everything has a docstring."""

import ast
import inspect
import pathlib

import gear
import gear._gear as ext

STUB = pathlib.Path(gear.__file__).with_name("_gear.pyi")


def stub_names():
    tree = ast.parse(STUB.read_text())
    names = {}
    for node in tree.body:
        if isinstance(node, ast.ClassDef):
            members = {n.name for n in node.body if isinstance(n, ast.FunctionDef)}
            members |= {n.target.id for n in node.body if isinstance(n, ast.AnnAssign)}
            names[node.name] = members
        elif isinstance(node, ast.FunctionDef):
            names[node.name] = set()
        elif isinstance(node, ast.AnnAssign):
            names[node.target.id] = set()
    return names


def test_every_public_class_and_method_has_a_stub():
    stubs = stub_names()
    for name, obj in vars(ext).items():
        if name.startswith("_"):
            continue
        assert name in stubs, f"{name} has no stub"
        if inspect.isclass(obj) and not issubclass(obj, BaseException):
            for member in vars(obj):
                if member.startswith("_") and member not in {"__getitem__", "__len__", "__enter__", "__exit__",
                                                             "__dlpack__", "__dlpack_device__", "__iter__", "__next__"}:
                    continue
                assert member in stubs[name], f"{name}.{member} has no stub"


def test_every_public_item_has_a_docstring():
    for name, obj in vars(ext).items():
        if name.startswith("_"):
            continue
        assert inspect.getdoc(obj), f"{name} has no docstring"
        if inspect.isclass(obj) and not issubclass(obj, BaseException):
            for member, value in vars(obj).items():
                if not member.startswith("_"):
                    assert inspect.getdoc(value), f"{name}.{member} has no docstring"
