"""The styles and scripts Great Expectations' Data Docs pages load from public CDNs, served by
the suite instead, so the pages render completely on a cluster without internet access.

GX writes <link>/<script> tags pointing at jsdelivr, cdnjs, unpkg, code.jquery.com and the
bootstrap CDNs. `bin/setup` (and the Airflow image's build) fetches the same packages, pinned
by version and npm integrity hash, from the npm registry into .cache/data-docs-assets; the Data
Docs app rewrites each CDN address in a page to the local copy as it serves it (the files GX
wrote stay untouched).

    python -m streamops.quality.docs_assets          fetch what is missing (idempotent)
"""

from __future__ import annotations

import base64
import hashlib
import io
import logging
import sys
import tarfile
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from streamops.paths import CACHE_DIR

log = logging.getLogger(__name__)

ASSETS_DIR = CACHE_DIR / "data-docs-assets"
NPM_REGISTRY = "https://registry.npmjs.org"


@dataclass(frozen=True)
class Package:
    name: str
    version: str
    integrity: str  # npm's sha512 of the tarball: a changed upload is refused

    @property
    def folder(self) -> str:
        return f"{self.name.replace('/', '+')}@{self.version}"


PACKAGES = [
    Package("jquery", "3.7.1",
            "sha512-m4avr8yL8kmFN8psrbFFFmB/If14iN5o9nw/NgnnM+kybDJpRsAynV2BsfpTYrTRysYUdADVD7CkUUizgkpLfg=="),
    Package("popper.js", "1.12.9",
            "sha512-s0EEi9xiSCdqz9lV4IiVH5yIZnDX/U1t0tCjB+0jXx9jW8lrR7kOpVupiUg175ogqVoudpDXHF1p6dKATCHMeg=="),
    Package("bootstrap", "4.3.1",
            "sha512-rXqOmH1VilAt2DyPzluTi2blhk17bO7ef+zLLPlWvG494pDxcM234pJ8wTc/6R40UWizAIIMgxjvxZg5kmsbag=="),
    Package("@forevolve/bootstrap-dark", "1.1.0",
            "sha512-A3ucpEpxPoTVO490lZZCfjPXxv832l7mm1IxX3bXyxvgwnPGXDLyh7dWrphXKO8YBAu3EswbBEu3VSW8NRMW3A=="),
    Package("bootstrap-datepicker", "1.9.0",
            "sha512-9rYYbaVOheGYxjOr/+bJCmRPihfy+LkLSg4fIFMT9Od8WwWB/MB50w0JO1eBgKUMbb7PFHQD5uAfI3ArAxZRXA=="),
    Package("bootstrap-table", "1.19.0",
            "sha512-L+USHm3X9FKocx/6yngGu12yF6r6s1Ntuc+hoIK2a2QQJjHw5kcySLiE2HY/9sEaSGAOfPbfQOtBH3uKkcpqEA=="),
    Package("bootstrap-table", "1.19.1",
            "sha512-WvV+l1AI/C+zThaKmfHmi/IuayVNB0qdFyEhFx1jyZhO0oLtNJNANkCR3rvJf6Dkh72dsLElxpE/bzK9seEQLA=="),
    Package("@fortawesome/fontawesome-free", "6.6.0",
            "sha512-60G28ke/sXdtS9KZCpZSHHkCbdsOGEhIUGlwq6yhY74UpTiToIh8np7A8yphhM4BWsvNFtIvLpi4co+h9Mr9Ow=="),
    Package("vega", "5.33.1",
            "sha512-1fArfVDUqVbb5z8n+/nVQb+VNBzx8svY6CrsyTK4Ujm4yrd9I1auoKxBAPXLCavY1LcrbHUskQbGUP8gXOzyQw=="),
    Package("vega-lite", "5.23.0",
            "sha512-l4J6+AWE3DIjvovEoHl2LdtCUkfm4zs8Xxx7INwZEAv+XVb6kR6vIN1gt3t2gN2gs/y4DYTs/RPoTeYAuEg6mA=="),
    Package("vega-embed", "6.29.0",
            "sha512-PmlshTLtLFLgWtF/b23T1OwX53AugJ9RZ3qPE2c01VFAbgt3/GSNI/etzA/GzdrkceXFma+FDHNXUppKuM0U6Q=="),
]
_BY_NAME = {(p.name, p.version): p for p in PACKAGES}


def _local(name: str, version: str, file: str) -> str:
    return f"{_BY_NAME[(name, version)].folder}/{file}"


# Each CDN address GX's templates use -> the same file in its npm package (relative to ASSETS_DIR).
CDN_FILES = {
    "https://code.jquery.com/jquery-3.7.1.min.js": _local("jquery", "3.7.1", "dist/jquery.min.js"),
    "https://cdnjs.cloudflare.com/ajax/libs/popper.js/1.12.9/umd/popper.min.js":
        _local("popper.js", "1.12.9", "dist/umd/popper.min.js"),
    "https://maxcdn.bootstrapcdn.com/bootstrap/4.3.1/css/bootstrap.min.css":
        _local("bootstrap", "4.3.1", "dist/css/bootstrap.min.css"),
    "https://stackpath.bootstrapcdn.com/bootstrap/4.3.1/js/bootstrap.min.js":
        _local("bootstrap", "4.3.1", "dist/js/bootstrap.min.js"),
    "https://cdn.jsdelivr.net/npm/@forevolve/bootstrap-dark@1.1.0/dist/css/bootstrap-prefers-dark.css":
        _local("@forevolve/bootstrap-dark", "1.1.0", "dist/css/bootstrap-prefers-dark.css"),
    "https://cdnjs.cloudflare.com/ajax/libs/bootstrap-datepicker/1.9.0/css/bootstrap-datepicker.min.css":
        _local("bootstrap-datepicker", "1.9.0", "dist/css/bootstrap-datepicker.min.css"),
    "https://cdnjs.cloudflare.com/ajax/libs/bootstrap-datepicker/1.9.0/js/bootstrap-datepicker.min.js":
        _local("bootstrap-datepicker", "1.9.0", "dist/js/bootstrap-datepicker.min.js"),
    "https://unpkg.com/bootstrap-table@1.19.0/dist/extensions/filter-control/bootstrap-table-filter-control.css":
        _local("bootstrap-table", "1.19.0", "dist/extensions/filter-control/bootstrap-table-filter-control.css"),
    "https://unpkg.com/bootstrap-table@1.19.0/dist/extensions/filter-control/bootstrap-table-filter-control.min.css":
        _local("bootstrap-table", "1.19.0", "dist/extensions/filter-control/bootstrap-table-filter-control.min.css"),
    "https://unpkg.com/bootstrap-table@1.19.1/dist/bootstrap-table.min.css":
        _local("bootstrap-table", "1.19.1", "dist/bootstrap-table.min.css"),
    "https://unpkg.com/bootstrap-table@1.19.1/dist/bootstrap-table.min.js":
        _local("bootstrap-table", "1.19.1", "dist/bootstrap-table.min.js"),
    "https://unpkg.com/bootstrap-table@1.19.1/dist/extensions/filter-control/bootstrap-table-filter-control.min.js":
        _local("bootstrap-table", "1.19.1", "dist/extensions/filter-control/bootstrap-table-filter-control.min.js"),
    # The stylesheet finds its fonts at ../webfonts/, which the package holds beside css/.
    "https://cdnjs.cloudflare.com/ajax/libs/font-awesome/6.6.0/css/all.min.css":
        _local("@fortawesome/fontawesome-free", "6.6.0", "css/all.min.css"),
    "https://cdn.jsdelivr.net/npm/vega@5": _local("vega", "5.33.1", "build/vega.min.js"),
    "https://cdn.jsdelivr.net/npm/vega-lite@5": _local("vega-lite", "5.23.0", "build/vega-lite.min.js"),
    "https://cdn.jsdelivr.net/npm/vega-embed@6": _local("vega-embed", "6.29.0", "build/vega-embed.min.js"),
}


def localise(html: str, assets_url: str) -> str:
    """The page with every known CDN address pointing at `assets_url`/<file> (longest first, so
    a prefix such as .../vega@5 never eats part of a longer address)."""
    for cdn in sorted(CDN_FILES, key=len, reverse=True):
        html = html.replace(f'"{cdn}"', f'"{assets_url}/{CDN_FILES[cdn]}"')
    return html


def missing(directory: Path = ASSETS_DIR) -> list[str]:
    """The local files a rewritten page would load that are not there."""
    return sorted(file for file in CDN_FILES.values() if not (directory / file).is_file())


def _verified_tarball(package: Package, data: bytes) -> bytes:
    algorithm, _, expected = package.integrity.partition("-")
    actual = base64.b64encode(hashlib.new(algorithm, data).digest()).decode()
    if actual != expected:
        raise ValueError(f"{package.name}@{package.version}: the registry's tarball does not match the pinned "
                         f"integrity {package.integrity} (got {algorithm}-{actual}); refusing it")
    return data


def fetch(directory: Path = ASSETS_DIR, registry: str = NPM_REGISTRY) -> list[str]:
    """Download and unpack each package not yet present; returns the ones fetched."""
    fetched = []
    for package in PACKAGES:
        target = directory / package.folder
        if (target / "package.json").is_file():
            continue
        short = package.name.rsplit("/", 1)[-1]
        url = f"{registry}/{package.name}/-/{short}-{package.version}.tgz"
        with urllib.request.urlopen(url, timeout=120) as response:  # noqa: S310 - a pinned https registry address
            data = _verified_tarball(package, response.read())
        partial = directory / f".{package.folder}.partial"
        with tarfile.open(fileobj=io.BytesIO(data)) as archive:
            members = []
            for member in archive.getmembers():
                # npm tarballs hold one top folder ("package/"); keep files only, never links.
                top, _, rest = member.name.partition("/")
                if not rest or not member.isfile():
                    continue
                member.name = rest
                members.append(member)
            archive.extractall(partial, members=members, filter="data")
        if target.exists():
            import shutil

            shutil.rmtree(target)
        partial.rename(target)
        fetched.append(f"{package.name}@{package.version}")
    return fetched


def main() -> int:
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    ASSETS_DIR.mkdir(parents=True, exist_ok=True)
    try:
        fetched = fetch()
    except (OSError, ValueError) as exc:
        print(f"Data Docs assets: could not fetch from {NPM_REGISTRY}: {exc}", file=sys.stderr)
        return 1
    absent = missing()
    if absent:
        print(f"Data Docs assets: still missing after the fetch: {', '.join(absent)}", file=sys.stderr)
        return 1
    print(f"Data Docs assets: {len(PACKAGES)} packages in {ASSETS_DIR}" + (f" (fetched {', '.join(fetched)})" if fetched else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
