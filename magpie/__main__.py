from magpie.cli import command

if __name__ == "__main__":  # process-pool workers re-import this module; they must not run the CLI
    command()
