"""Safe rendering of user-provided strings into shell scripts, comments and resource names (the
Kubernetes manifests are data, quoted by their YAML dumper).

Every value from a plan that reaches a generated file goes through one of these: names a person
chose (model name) are never trusted, even though the planner validated their length.
"""

from __future__ import annotations

import pprint
import re
import shlex

_UNSAFE_COMMENT = re.compile(r"[^A-Za-z0-9 ._:/+=@,()-]")
_DNS_BAD = re.compile(r"[^a-z0-9-]+")
_SLUG_BAD = re.compile(r"[^A-Za-z0-9._-]+")
_HEX = re.compile(r"^[0-9a-f]{1,128}$")
IMAGE_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._/:@+-]{0,254}$"
"""registry[:port]/path[:tag][@sha256:digest] without whitespace, quotes or shell metacharacters
(public so that the API can declare it in its schema)."""
_IMAGE = re.compile(IMAGE_PATTERN)


class UnsafeValueError(ValueError):
    """A value that cannot be rendered safely (e.g. a container image with shell characters).

    `field` names the render input it came from (`image`, `torch_version`, ...) when one did."""

    def __init__(self, message: str, *, field: str | None = None) -> None:
        super().__init__(message)
        self.field = field


def sh(value: str | int | float) -> str:
    """A single shell word whose value is exactly `value`."""
    return shlex.quote(str(value))


def python_literal(value: object) -> str:
    """Python source for plain data (None, bool, int, finite float, str, and lists, tuples and dicts of
    them): its repr (wrapped at 100 columns, in its own order), which reads back as an equal value. A
    generated Python module takes every value from the plan through this, so no plan string can become
    code."""
    _check_literal(value)
    return pprint.pformat(value, width=100, sort_dicts=False)


def _check_literal(value: object) -> None:
    if value is None or isinstance(value, bool | int | str):
        return
    if isinstance(value, float):
        if value != value or value in (float("inf"), float("-inf")):
            raise UnsafeValueError(f"{value!r} has no Python literal")
        return
    if isinstance(value, list | tuple):
        for item in value:
            _check_literal(item)
        return
    if isinstance(value, dict):
        for key, item in value.items():
            _check_literal(key)
            _check_literal(item)
        return
    raise UnsafeValueError(f"{type(value).__name__} is not plain data: it cannot be written as a literal")


def comment(value: str, *, limit: int = 80) -> str:
    """Text safe inside a `#` comment of any script or YAML file: one line, printable ASCII only."""
    text = _UNSAFE_COMMENT.sub("_", value)[:limit]
    return text or "_"


def slug(value: str, *, limit: int = 40) -> str:
    """Letters, digits, `.`, `_`, `-` only (file names, SLURM job names)."""
    text = _SLUG_BAD.sub("-", value).strip("-.")[:limit].strip("-.")
    return text or "plan"


def dns_label(value: str, *, suffix: str, limit: int = 63) -> str:
    """A Kubernetes DNS-1123 label (`[a-z0-9]([-a-z0-9]*[a-z0-9])?`, <= 63) ending in `-suffix`."""
    base = _DNS_BAD.sub("-", value.lower()).strip("-")
    room = limit - len(suffix) - 1
    base = base[:room].strip("-") or "plan"
    if not base[0].isalpha():
        base = "p" + base[: room - 1]
    return f"{base}-{suffix}"


def hex_id(value: str) -> str:
    """A lowercase hex string (plan hashes), refused otherwise."""
    if not _HEX.match(value):
        raise UnsafeValueError(f"expected a hex digest, got {value!r}")
    return value


def image_ref(value: str) -> str:
    """A container image reference, refused when it holds anything but image-name characters."""
    if not _IMAGE.match(value):
        raise UnsafeValueError(
            f"container image {value!r}: use a plain reference such as registry.example.com/team/train:1.0",
            field="image",
        )
    return value


VERSION3 = r"^[0-9]{1,2}\.[0-9]{1,3}\.[0-9]{1,3}$"
"""X.Y.Z: the shape of a torch version (bundle.torch_image also refuses one older than the runtime)."""
TORCH_VERSION_PATTERN = r"^(?:2\.(?:[6-9]|[1-9][0-9]{1,2})|(?:[3-9]|[1-9][0-9])\.[0-9]{1,3})\.[0-9]{1,3}$"
"""The API's schema for a torch version: X.Y.Z and at least 2.6, the oldest the runtime supports."""
CUDA_VERSION_PATTERN = r"^[0-9]{1,2}\.[0-9]{1,2}$"
ROCM_VERSION_PATTERN = r"^[0-9]{1,2}\.[0-9]{1,2}(?:\.[0-9]{1,2})?$"
"""A ROCm release as AMD's image tags write it: `7.2`, or with its patch level, `6.4.1`."""
RESOURCE_PATTERN = (
    r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*"  # domain
    r"/[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$"  # /name
)
"""A Kubernetes extended resource name, `domain/name` (e.g. `rdma/rdma_shared_device_a`). No
look-ahead (the API's schema validators lack it): `resource_name` refuses nvidia.com/gpu itself."""


def version(value: str, pattern: str, *, field: str, example: str) -> str:
    """A dotted version number (`2.13.0`, `13.0`), refused otherwise."""
    if not re.fullmatch(pattern, value):
        raise UnsafeValueError(f"{field} {value!r}: give a version number such as {example}", field=field)
    return value


def resource_name(value: str, *, field: str) -> str:
    """A Kubernetes extended resource name (`vendor.example/device`), refused otherwise."""
    if value == "nvidia.com/gpu":
        raise UnsafeValueError(f"{field}: nvidia.com/gpu is the GPUs, requested already", field=field)
    if len(value) > 253 or not re.fullmatch(RESOURCE_PATTERN, value):
        raise UnsafeValueError(
            f"{field} {value!r}: give the extended resource your device plugin advertises, "
            "e.g. rdma/rdma_shared_device_a",
            field=field,
        )
    return value


def positive_int(value: object, what: str) -> int:
    """An int >= 1 (node and GPU counts), refused otherwise (bool is not an int here)."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise UnsafeValueError(f"{what}: expected a positive integer, got {value!r}")
    return value


LABEL_VALUE_PATTERN = r"^(?:[A-Za-z0-9](?:[-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?)?$"
"""A Kubernetes label value: at most 63 characters, alphanumerics with `-`, `_`, `.` inside."""
DNS_SUBDOMAIN_PATTERN = r"^[a-z0-9](?:[-a-z0-9]*[a-z0-9])?(?:\.[a-z0-9](?:[-a-z0-9]*[a-z0-9])?)*$"
"""A DNS-1123 subdomain (object names such as a PriorityClass; at most 253 characters)."""
QUEUE_PATTERN = r"^[a-z0-9](?:[-a-z0-9.]{0,61}[a-z0-9])?$"
"""A Kueue LocalQueue name as its label value holds it: an object name of at most 63 characters."""
_NAME = r"[A-Za-z0-9](?:[-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?"
_KEY = rf"(?:{DNS_SUBDOMAIN_PATTERN[1:-1]}/)?{_NAME}"
NODE_SELECTOR_PATTERN = rf"^{_KEY}=(?:{_NAME})?$"
"""`key=value` of a node selector, for the API's schema (without the rule that a key comes once)."""
TOLERATION_PATTERN = rf"^{_KEY}(?:=(?:{_NAME})?)?(?::(?:NoSchedule|PreferNoSchedule|NoExecute))?$"
"""`key[=value][:Effect]` of a toleration, for the API's schema."""


def label_value(value: str, *, field: str) -> str:
    """A Kubernetes label value, refused otherwise."""
    if not re.fullmatch(LABEL_VALUE_PATTERN, value):
        raise UnsafeValueError(
            f"{field} {value!r}: a Kubernetes label value has at most 63 letters, digits, '-', '_' or '.', "
            "starting and ending with a letter or digit",
            field=field,
        )
    return value


def qualified_name(value: str, *, field: str) -> str:
    """A label or taint key, `[prefix/]name` (prefix a DNS subdomain, name a label value), refused
    otherwise."""
    prefix, slash, name = value.rpartition("/")
    if (
        not name
        or not re.fullmatch(LABEL_VALUE_PATTERN, name)
        or (slash and (len(prefix) > 253 or not re.fullmatch(DNS_SUBDOMAIN_PATTERN, prefix)))
    ):
        raise UnsafeValueError(
            f"{field} key {value!r}: give a Kubernetes label key such as node.kubernetes.io/instance-type "
            "or gpu-type ([DNS prefix/]name, the name at most 63 letters, digits, '-', '_', '.')",
            field=field,
        )
    return value


def dns_subdomain(value: str, *, field: str) -> str:
    """A Kubernetes object name (DNS-1123 subdomain), refused otherwise."""
    if len(value) > 253 or not re.fullmatch(DNS_SUBDOMAIN_PATTERN, value):
        raise UnsafeValueError(
            f"{field} {value!r}: give a Kubernetes object name (lowercase letters, digits, '-' and '.')",
            field=field,
        )
    return value
