from mmq.cli import app

app()
