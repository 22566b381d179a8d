"""`python -m lptrain`: the same as the `lptrain` command."""
from lptrain.entry import main

if __name__ == "__main__":
    main()
