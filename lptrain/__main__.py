"""`python -m lptrain`: the same as the `lptrain` command."""
from lptrain.cli import main

if __name__ == "__main__":
    main()
