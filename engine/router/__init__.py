"""Router mode: one supervised child server per model, their presets and Hub listings."""
