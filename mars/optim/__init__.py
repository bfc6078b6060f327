"""mars.optim"""
