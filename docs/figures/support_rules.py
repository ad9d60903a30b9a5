from pathlib import Path
def draw_all(folder: Path) -> list[Path]:
    return []
