from clawmem.cli import main

if __name__ == "__main__":  # chunking workers are spawned and re-import this module
    main()
